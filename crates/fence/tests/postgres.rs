//! Fenced updates against a real PostgreSQL server, named by
//! `DEADBOLT_TEST_POSTGRES_URL` (`scripts/postgres.sh` starts one and prints
//! it; `scripts/test.sh` does both). Without it these tests are skipped,
//! loudly, unless `DEADBOLT_REQUIRE_POSTGRES=1`, which makes them fail.
//!
//! Each test works in a table of its own, so they run in parallel.

#![cfg(feature = "postgres")]

use std::io::Write;
use std::sync::Once;

use deadbolt_fence::postgres::{execute_fenced, FencedTable, UpdateError};
use deadbolt_fence::Stale;
use tokio_postgres::{Client, NoTls};

const URL_VAR: &str = "DEADBOLT_TEST_POSTGRES_URL";

/// The server's URL, or `None` (after saying so) if the tests should skip.
fn server_url() -> Option<String> {
    match std::env::var(URL_VAR) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("DEADBOLT_REQUIRE_POSTGRES").as_deref() == Ok("1") => panic!(
            "DEADBOLT_REQUIRE_POSTGRES=1 but {URL_VAR} is not set: \
             run `eval \"$(scripts/postgres.sh)\"` first"
        ),
        _ => {
            // Straight to stderr, once: the test harness swallows eprintln!
            // from passing tests, and a skip nobody sees is a silent pass.
            static SAID: Once = Once::new();
            SAID.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "\n*** PostgreSQL tests skipped: set {URL_VAR} \
                     (scripts/test.sh does this) ***\n"
                );
            });
            None
        }
    }
}

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {URL_VAR}: {e}"));
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("postgres connection ended: {e}");
        }
    });
    client
}

/// A fresh `(id BIGINT PRIMARY KEY, data TEXT, fence BIGINT NOT NULL
/// DEFAULT 0)` table named after the test, with rows 1 and 2 unfenced.
struct TestTable {
    client: Client,
    name: String,
}

impl TestTable {
    async fn create(url: &str, test: &str) -> TestTable {
        let client = connect(url).await;
        // Unique per test and per process: parallel tests, and parallel runs
        // against one server, never share a table.
        let name = format!("fence_{test}_{}", std::process::id());
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {name};
                 CREATE TABLE {name} (
                     id BIGINT PRIMARY KEY,
                     data TEXT NOT NULL,
                     fence BIGINT NOT NULL DEFAULT 0
                 );
                 INSERT INTO {name} (id, data) VALUES (1, 'initial'), (2, 'initial');"
            ))
            .await
            .unwrap();
        TestTable { client, name }
    }

    fn fenced(&self) -> FencedTable {
        FencedTable::new(&self.name).unwrap()
    }

    async fn row(&self, id: i64) -> (String, i64) {
        let row = self
            .client
            .query_one(
                &format!("SELECT data, fence FROM {} WHERE id = $1", self.name),
                &[&id],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    }

    async fn drop_table(self) {
        self.client
            .batch_execute(&format!("DROP TABLE {}", self.name))
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn newer_token_wins_older_is_refused_and_changes_nothing() {
    let Some(url) = server_url() else { return };
    let t = TestTable::create(&url, "newer_wins").await;
    let files = t.fenced();

    files
        .update(&t.client, &1_i64, 33, "data = $1", &[&"from 33"])
        .await
        .unwrap();
    assert_eq!(t.row(1).await, ("from 33".to_owned(), 33));
    files
        .update(&t.client, &1_i64, 34, "data = $1", &[&"from 34"])
        .await
        .unwrap();
    assert_eq!(t.row(1).await, ("from 34".to_owned(), 34));

    let err = files
        .update(&t.client, &1_i64, 33, "data = $1", &[&"late write from 33"])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            UpdateError::Stale(Stale {
                presented: 33,
                highest: 34
            })
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "stale fencing token 33: this resource already accepted token 34"
    );
    assert_eq!(t.row(1).await, ("from 34".to_owned(), 34), "row unchanged");
    assert_eq!(
        t.row(2).await,
        ("initial".to_owned(), 0),
        "other rows untouched"
    );
    t.drop_table().await;
}

#[tokio::test]
async fn equal_token_is_accepted_again() {
    let Some(url) = server_url() else { return };
    let t = TestTable::create(&url, "equal_token").await;
    let files = t.fenced();
    for data in ["first", "second", "third"] {
        files
            .update(&t.client, &1_i64, 7, "data = $1", &[&data])
            .await
            .unwrap();
        assert_eq!(t.row(1).await, (data.to_owned(), 7));
    }
    t.drop_table().await;
}

#[tokio::test]
async fn missing_row_is_reported_as_missing() {
    let Some(url) = server_url() else { return };
    let t = TestTable::create(&url, "missing_row").await;
    let err = t
        .fenced()
        .update(&t.client, &99_i64, 5, "data = $1", &[&"nobody"])
        .await
        .unwrap_err();
    assert!(matches!(err, UpdateError::Missing), "{err:?}");
    t.drop_table().await;
}

#[tokio::test]
async fn token_above_bigint_is_refused_before_touching_the_row() {
    let Some(url) = server_url() else { return };
    let t = TestTable::create(&url, "token_range").await;
    let too_big = i64::MAX as u64 + 1;
    let err = t
        .fenced()
        .update(&t.client, &1_i64, too_big, "data = $1", &[&"wrapped?"])
        .await
        .unwrap_err();
    assert!(
        matches!(err, UpdateError::TokenOutOfRange(t) if t == too_big),
        "{err:?}"
    );
    assert_eq!(t.row(1).await, ("initial".to_owned(), 0));

    // The largest token that fits is stored as it is, and then refuses
    // everything below it.
    let max = i64::MAX as u64;
    let files = t.fenced();
    files
        .update(&t.client, &1_i64, max, "data = $1", &[&"max"])
        .await
        .unwrap();
    assert_eq!(t.row(1).await, ("max".to_owned(), i64::MAX));
    assert!(matches!(
        files
            .update(&t.client, &1_i64, max - 1, "data = $1", &[&"x"])
            .await,
        Err(UpdateError::Stale(_))
    ));
    t.drop_table().await;
}

#[tokio::test]
async fn execute_fenced_runs_a_caller_written_statement() {
    let Some(url) = server_url() else { return };
    let t = TestTable::create(&url, "caller_sql").await;
    let update = format!(
        "UPDATE {} SET data = $3 || ' by ' || $1::BIGINT, fence = $1 WHERE id = $2 AND fence <= $1",
        t.name
    );
    let current_fence = format!("SELECT fence FROM {} WHERE id = $1", t.name);
    let fenced = |token: u64, id: i64, data: &'static str| {
        let (client, update, current_fence) = (&t.client, &update, &current_fence);
        async move { execute_fenced(client, token, update, &[&id, &data], current_fence, &[&id]).await }
    };

    assert_eq!(fenced(10, 1, "written").await.unwrap(), 1);
    assert_eq!(t.row(1).await, ("written by 10".to_owned(), 10));
    assert!(matches!(
        fenced(9, 1, "stale").await,
        Err(UpdateError::Stale(Stale {
            presented: 9,
            highest: 10
        }))
    ));
    assert!(matches!(
        fenced(11, 3, "nobody").await,
        Err(UpdateError::Missing)
    ));
    assert_eq!(t.row(1).await, ("written by 10".to_owned(), 10));
    t.drop_table().await;
}

#[tokio::test]
async fn works_inside_a_transaction() {
    let Some(url) = server_url() else { return };
    let mut t = TestTable::create(&url, "transaction").await;
    let files = t.fenced();
    let tx = t.client.transaction().await.unwrap();
    files
        .update(&tx, &1_i64, 4, "data = $1", &[&"in tx"])
        .await
        .unwrap();
    assert!(matches!(
        files
            .update(&tx, &1_i64, 3, "data = $1", &[&"stale in tx"])
            .await,
        Err(UpdateError::Stale(_))
    ));
    tx.commit().await.unwrap();
    assert_eq!(t.row(1).await, ("in tx".to_owned(), 4));
    t.drop_table().await;
}

/// Writers with interleaved tokens race on one row over their own
/// connections: whatever the order they reach the database in, the row ends
/// with the highest token's data, and every refusal names a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_end_with_the_highest_tokens_value() {
    let Some(url) = server_url() else { return };
    let t = TestTable::create(&url, "concurrent").await;
    // Interleaved rather than sorted, so lower tokens often arrive last.
    let tokens: Vec<u64> = vec![5, 12, 3, 17, 8, 20, 1, 15, 11, 19, 2, 14, 7, 16, 4, 18];
    let mut writers = Vec::new();
    for &token in &tokens {
        let (url, files) = (url.clone(), t.fenced());
        writers.push(tokio::spawn(async move {
            let client = connect(&url).await;
            let mut outcomes = Vec::new();
            // Each writer writes several times with its one token, as a
            // holder does.
            for round in 0..5 {
                let data = format!("token {token} round {round}");
                outcomes.push(
                    files
                        .update(&client, &1_i64, token, "data = $1", &[&data])
                        .await,
                );
                tokio::task::yield_now().await;
            }
            (token, outcomes)
        }));
    }

    let (mut admitted, mut refused) = (0, 0);
    for writer in writers {
        let (token, outcomes) = writer.await.unwrap();
        for outcome in outcomes {
            match outcome {
                Ok(()) => admitted += 1,
                Err(UpdateError::Stale(stale)) => {
                    refused += 1;
                    assert_eq!(stale.presented, token);
                    assert!(stale.highest > token, "{stale}");
                }
                Err(other) => panic!("token {token}: {other}"),
            }
        }
    }
    let highest = *tokens.iter().max().unwrap();
    assert!(admitted >= 5, "the highest token's writes always get in");
    // Only if all 80 writes reached the database in token order would none
    // be refused.
    assert!(
        refused > 0,
        "no write was refused: the writers did not race"
    );
    assert_eq!(
        t.row(1).await,
        (format!("token {highest} round 4"), highest as i64)
    );
    t.drop_table().await;
}
