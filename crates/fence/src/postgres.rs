//! Fenced row updates in PostgreSQL (feature `postgres`, on by default): the
//! token check and the write are one `UPDATE`, so the database itself refuses
//! a stale holder, whatever the order in which writers reach it.
//!
//! # Schema
//!
//! Each fenced row carries the highest token that wrote it:
//!
//! ```sql
//! ALTER TABLE files ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
//! ```
//!
//! `NOT NULL` matters: `fence <= $t` is never true for a NULL, so a NULL
//! fence would refuse every token. `DEFAULT 0` lets any token write a row
//! that was never fenced.
//!
//! # The update
//!
//! ```sql
//! UPDATE files SET data = $1, fence = $2 WHERE id = $3 AND fence <= $2
//! ```
//!
//! One row updated: the token was current, and the row now remembers it.
//! Zero rows: either the row's fence is higher (the token is stale) or there
//! is no such row; a second query reads the fence to tell which, and the
//! error names both tokens. `<=` and not `<`: a holder writes as many times
//! as it likes with its one token.
//!
//! # Tokens are u64, BIGINT is i64
//!
//! PostgreSQL has no unsigned integers. Tokens up to `i64::MAX` are stored
//! as they are; a larger one is refused with
//! [`UpdateError::TokenOutOfRange`] before anything is sent, because
//! wrapping it to a negative number would make it compare lower than every
//! real token. (Deadbolt counts tokens up from 1, one per grant, so this is a
//! guard against corrupt input, not a limit anyone reaches.)

use tokio_postgres::types::ToSql;
use tokio_postgres::GenericClient;

use crate::gate::Stale;

/// Why a fenced update did not happen.
#[derive(Debug, thiserror::Error)]
pub enum UpdateError {
    /// The row has already been written with a higher token.
    #[error(transparent)]
    Stale(#[from] Stale),
    /// No row matched, and not because of its fence: the row does not exist
    /// (or did not when the update ran). With [`execute_fenced`], also when
    /// the row exists but the statement's other conditions did not hold.
    #[error("no row to update: the fenced update matched none, and not because of the fence")]
    Missing,
    /// The token does not fit in a BIGINT; nothing was sent.
    #[error(
        "fencing token {0} does not fit in a PostgreSQL BIGINT (at most 9223372036854775807); \
         refused rather than wrapped to a negative number"
    )]
    TokenOutOfRange(u64),
    /// The database reported an error (connection, SQL, types).
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] tokio_postgres::Error),
}

/// Runs `update`, a fenced `UPDATE` whose **`$1` is the fencing token** and
/// whose own parameters `params` are `$2`, `$3`, …; returns the number of
/// rows it updated (at least 1).
///
/// `update` must only touch rows whose fence is at most the token, and set
/// their fence to it: `... SET ..., fence = $1 WHERE ... AND fence <= $1`.
/// If it updates nothing, `current_fence` (a `SELECT` of the row's fence,
/// with parameters `key`, returning no row if there is none) tells a stale
/// token ([`UpdateError::Stale`]) from a missing row
/// ([`UpdateError::Missing`]).
///
/// Use this for statements [`FencedTable`] cannot build (extra conditions,
/// composite keys, `RETURNING`-free updates of several rows). The token is
/// bound here, as a checked BIGINT, so no caller can wrap it by mistake.
///
/// ```no_run
/// # async fn example(client: &tokio_postgres::Client, token: u64) -> Result<(), deadbolt_fence::postgres::UpdateError> {
/// use deadbolt_fence::postgres::execute_fenced;
///
/// let (tenant, name, data) = ("acme", "report.csv", b"...".as_slice());
/// execute_fenced(
///     client,
///     token,
///     "UPDATE files SET data = $4, fence = $1 \
///      WHERE tenant = $2 AND name = $3 AND fence <= $1",
///     &[&tenant, &name, &data],
///     "SELECT fence FROM files WHERE tenant = $1 AND name = $2",
///     &[&tenant, &name],
/// )
/// .await?;
/// # Ok(()) }
/// ```
pub async fn execute_fenced<C>(
    client: &C,
    token: u64,
    update: &str,
    params: &[&(dyn ToSql + Sync)],
    current_fence: &str,
    key: &[&(dyn ToSql + Sync)],
) -> Result<u64, UpdateError>
where
    C: GenericClient + Sync,
{
    let bigint = to_bigint(token)?;
    let mut all: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(params.len() + 1);
    all.push(&bigint);
    all.extend_from_slice(params);
    run(client, token, update, &all, current_fence, key).await
}

/// The common shape of a fenced table: rows found by a key column, fenced by
/// a `BIGINT NOT NULL DEFAULT 0` column. Builds the fenced `UPDATE` and the
/// fence lookup once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedTable {
    table: String,
    id_column: String,
    fence_column: String,
    current_fence: String,
}

/// A table or column name that [`FencedTable`] will not put into SQL.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a plain SQL name (letters, digits and _, not starting with a digit; a table may be schema.table)")]
pub struct InvalidName(String);

impl FencedTable {
    /// The table `table`, keyed by column `id`, fenced by column `fence`.
    ///
    /// Names are used as you would write them unquoted in SQL (so
    /// PostgreSQL folds them to lower case); only plain names are accepted,
    /// since they are pasted into the statement.
    pub fn new(table: &str) -> Result<Self, InvalidName> {
        Self::with_columns(table, "id", "fence")
    }

    /// Like [`FencedTable::new`], with other names for the key and fence
    /// columns.
    pub fn with_columns(
        table: &str,
        id_column: &str,
        fence_column: &str,
    ) -> Result<Self, InvalidName> {
        check_name(table, true)?;
        check_name(id_column, false)?;
        check_name(fence_column, false)?;
        Ok(FencedTable {
            current_fence: format!("SELECT {fence_column} FROM {table} WHERE {id_column} = $1"),
            table: table.to_owned(),
            id_column: id_column.to_owned(),
            fence_column: fence_column.to_owned(),
        })
    }

    /// Applies `set` to the row whose key is `id`, if `token` is at least
    /// the row's fence, and raises the fence to `token`, in one `UPDATE`:
    ///
    /// ```sql
    /// UPDATE {table} SET {set}, {fence} = $n+1 WHERE {id} = $n+2 AND {fence} <= $n+1
    /// ```
    ///
    /// `set` is an assignment list written by the program (never user
    /// input) whose parameters `$1`…`$n` are `params`, e.g.
    /// `"data = $1, updated_at = now()"`. The key column is expected to be
    /// unique.
    ///
    /// ```no_run
    /// # async fn example(client: &tokio_postgres::Client, token: u64) -> Result<(), Box<dyn std::error::Error>> {
    /// use deadbolt_fence::postgres::{FencedTable, UpdateError};
    ///
    /// let files = FencedTable::new("files")?;
    /// match files.update(client, &42_i64, token, "data = $1", &[&"new contents"]).await {
    ///     Ok(()) => {}
    ///     Err(UpdateError::Stale(stale)) => eprintln!("lost the lock: {stale}"),
    ///     Err(other) => return Err(other.into()),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn update<C>(
        &self,
        client: &C,
        id: &(dyn ToSql + Sync),
        token: u64,
        set: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), UpdateError>
    where
        C: GenericClient + Sync,
    {
        let bigint = to_bigint(token)?;
        let (token_param, id_param) = (params.len() + 1, params.len() + 2);
        let update = format!(
            "UPDATE {table} SET {set}, {fence} = ${token_param} \
             WHERE {id} = ${id_param} AND {fence} <= ${token_param}",
            table = self.table,
            fence = self.fence_column,
            id = self.id_column,
        );
        let mut all: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(params.len() + 2);
        all.extend_from_slice(params);
        all.push(&bigint);
        all.push(id);
        run(client, token, &update, &all, &self.current_fence, &[id]).await?;
        Ok(())
    }
}

/// The update, then, if it changed nothing, the fence lookup that says why.
async fn run<C>(
    client: &C,
    token: u64,
    update: &str,
    params: &[&(dyn ToSql + Sync)],
    current_fence: &str,
    key: &[&(dyn ToSql + Sync)],
) -> Result<u64, UpdateError>
where
    C: GenericClient + Sync,
{
    let updated = client.execute(update, params).await?;
    if updated > 0 {
        return Ok(updated);
    }
    let Some(row) = client.query_opt(current_fence, key).await? else {
        return Err(UpdateError::Missing);
    };
    let fence: i64 = row.try_get(0)?;
    // A fence that does not fit a u64 (negative) is below every token.
    match u64::try_from(fence) {
        Ok(highest) if highest > token => Err(Stale {
            presented: token,
            highest,
        }
        .into()),
        // The row's fence would have let the update through, so the row was
        // not there when the UPDATE looked: in READ COMMITTED, another
        // transaction inserted it between our two statements.
        _ => Err(UpdateError::Missing),
    }
}

fn to_bigint(token: u64) -> Result<i64, UpdateError> {
    i64::try_from(token).map_err(|_| UpdateError::TokenOutOfRange(token))
}

/// Accepts `name` (or `schema.name` if `qualified`) made of ASCII letters,
/// digits and `_`, not starting with a digit: nothing that could end the
/// identifier and start SQL of its own.
fn check_name(name: &str, qualified: bool) -> Result<(), InvalidName> {
    let part_ok = |part: &str| {
        let mut chars = part.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let ok = match name.split_once('.') {
        Some((schema, table)) if qualified => part_ok(schema) && part_ok(table),
        Some(_) => false,
        None => part_ok(name),
    };
    if ok {
        Ok(())
    } else {
        Err(InvalidName(name.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_above_i64_max_are_refused_not_wrapped() {
        assert_eq!(to_bigint(7).unwrap(), 7);
        assert_eq!(to_bigint(i64::MAX as u64).unwrap(), i64::MAX);
        let err = to_bigint(i64::MAX as u64 + 1).unwrap_err();
        assert!(matches!(err, UpdateError::TokenOutOfRange(t) if t == 1 << 63));
        assert!(err.to_string().contains("9223372036854775808"), "{err}");
    }

    #[test]
    fn builds_the_statements_from_plain_names() {
        let table = FencedTable::with_columns("app.files", "file_id", "fence_token").unwrap();
        assert_eq!(
            table.current_fence,
            "SELECT fence_token FROM app.files WHERE file_id = $1"
        );
    }

    #[test]
    fn refuses_names_that_are_not_plain() {
        for bad in [
            "",
            "1files",
            "files; DROP TABLE x",
            "\"files\"",
            "a.b.c",
            "files-x",
        ] {
            assert!(FencedTable::new(bad).is_err(), "{bad:?}");
        }
        assert!(FencedTable::with_columns("files", "a.b", "fence").is_err());
        assert_eq!(
            FencedTable::new("x y").unwrap_err().to_string(),
            "\"x y\" is not a plain SQL name (letters, digits and _, not starting with a digit; \
             a table may be schema.table)"
        );
    }
}
