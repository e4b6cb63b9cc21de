//! The web dashboard at `/ui`: one page (`index.html`, `app.js`, embedded in
//! the binary: no CDN, no build step, no framework) and the small JSON reads
//! it polls under `/ui/api/`. See docs/operations.md, "Dashboard".
//!
//! Why the reads come from the answering node's own applied table, without
//! the linearizable barrier the lock API's reads pass: a dashboard must keep
//! working when it matters most, during an election or on the minority side
//! of a partition, on whichever node the operator opened. A follower's view
//! lags the leader's by its apply lag at most, and the page says which node
//! answered, its role and its applied index, so staleness shows. Nothing is
//! decided from these reads. Only lease time left lives on the leader alone
//! (its timers are not replicated): a follower reports it as unknown and the
//! page links to the leader's dashboard.
//!
//! Fast with a million locks: every listing is a page (at most
//! [`MAX_PAGE`] rows) read from the table's ordered map from a cursor, so
//! its cost is the page's, not the table's; at most [`MAX_WAITERS`] waiters
//! of each lock are listed, with their count.
//!
//! Permissions (see `auth/`): the page needs none (it holds no data); with
//! access control on, every `/ui/api/` read needs `read` (lock listings and
//! history show only the locks the caller may read). The page sends the
//! token it is given as `Authorization: Bearer` on every request.

use crate::auth::{Caller, Credentials};
use crate::http::HttpError;
use crate::node::{ApiError, Node};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use deadbolt_core::{validate_lock_name, Limits, LockInfo, LockTable, Permission, SessionId};
use deadbolt_proto::ErrorKind;
use serde::{Deserialize, Serialize};

/// The largest page of locks or sessions, and the default.
pub const MAX_PAGE: usize = 200;
const DEFAULT_PAGE: usize = 50;
/// Waiters listed per lock (the rest are counted).
pub const MAX_WAITERS: usize = 20;

const INDEX_HTML: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
/// Only this page's own script and requests to this node: a token typed
/// into the page cannot be sent elsewhere by injected markup.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'";

/// The page, its script and its reads, for every node's HTTP router.
pub fn router(node: Node) -> Router {
    Router::new()
        .route("/ui", get(|| asset("text/html; charset=utf-8", INDEX_HTML)))
        .route(
            "/ui/",
            get(|| asset("text/html; charset=utf-8", INDEX_HTML)),
        )
        .route(
            "/ui/app.js",
            get(|| asset("text/javascript; charset=utf-8", APP_JS)),
        )
        .route("/ui/api/cluster", get(cluster))
        .route("/ui/api/locks", get(locks))
        .route("/ui/api/sessions", get(sessions))
        .route("/ui/api/history", get(history))
        .with_state(node)
}

async fn asset(content_type: &'static str, body: &'static str) -> Response {
    let headers = [
        (header::CONTENT_TYPE, content_type),
        (header::CACHE_CONTROL, "no-cache"),
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ];
    (headers, body).into_response()
}

type Reply<T> = Result<Json<T>, HttpError>;

/// The caller, if it may `read` `lock` (`None`: anything at all).
async fn reader(
    node: &Node,
    credentials: &Credentials,
    lock: Option<&str>,
) -> Result<Caller, HttpError> {
    let caller = node.authenticate(credentials).await?;
    node.permit(&caller, Permission::Read, lock)?;
    Ok(caller)
}

fn invalid(message: String) -> HttpError {
    ApiError::new(ErrorKind::InvalidArgument, message).into()
}

/// A page size: 0 or absent is the default, above [`MAX_PAGE`] is refused.
fn page_size(limit: Option<usize>) -> Result<usize, HttpError> {
    match limit.unwrap_or(0) {
        0 => Ok(DEFAULT_PAGE),
        limit if limit <= MAX_PAGE => Ok(limit),
        limit => Err(invalid(format!(
            "limit {limit} is above the largest page, {MAX_PAGE}: page with `after`"
        ))),
    }
}

#[derive(Serialize)]
struct ClusterView {
    /// The node that answered, as it sees the cluster.
    status: deadbolt_proto::v1::ClusterStatusResponse,
    leader_address: Option<String>,
    /// On the leader only: the last log index each member has acknowledged.
    matched: Option<Vec<(u64, Option<u64>)>>,
    sessions: usize,
    locks: usize,
    next_token: u64,
    /// Each member's release and numbers, as the member itself reports them.
    releases: Vec<MemberRelease>,
}

#[derive(Serialize)]
struct MemberRelease {
    node_id: u64,
    /// The member's release and compatibility numbers; `None`: it did not
    /// answer in time.
    versions: Option<deadbolt_proto::v1::BuildVersions>,
}

/// How long the page waits for a member to say which release it runs: a
/// member down or cut off must not hold the page up.
const RELEASE_QUERY_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(300);

/// Each member's release, asked of the member itself (its `Cluster.Status`,
/// as `deadbolt cluster status` does), so that during a rolling upgrade the
/// page shows who runs what. One query per member and refresh: the members
/// are few (a cluster is 3 or 5 voters).
async fn member_releases(
    node: &Node,
    status: &deadbolt_proto::v1::ClusterStatusResponse,
) -> Vec<MemberRelease> {
    let queries = status.members.iter().map(|member| async move {
        let versions = if member.node_id == node.id {
            Some(crate::version::build_versions())
        } else {
            let query = crate::cluster::query_status(&member.address, node.tls.as_deref());
            match tokio::time::timeout(RELEASE_QUERY_TIMEOUT, query).await {
                Ok(Ok(answer)) => answer.versions,
                _ => None,
            }
        };
        MemberRelease {
            node_id: member.node_id,
            versions,
        }
    });
    futures::future::join_all(queries).await
}

async fn cluster(State(node): State<Node>, credentials: Credentials) -> Reply<ClusterView> {
    let _caller = reader(&node, &credentials, None).await?;
    let status = node.cluster_status().await;
    let leader_address = status.leader_id.and_then(|leader| {
        let member = status.members.iter().find(|m| m.node_id == leader);
        member.map(|m| m.address.clone())
    });
    let matched = node.raft.metrics().borrow().replication.as_ref().map(|r| {
        r.iter()
            .map(|(id, log_id)| (*id, log_id.map(|l| l.index)))
            .collect()
    });
    let health = node.health();
    let releases = member_releases(&node, &status).await;
    Ok(Json(ClusterView {
        releases,
        status,
        leader_address,
        matched,
        sessions: health.sessions,
        locks: health.locks,
        next_token: health.next_token.0,
    }))
}

#[derive(Deserialize)]
struct LocksQuery {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    after: String,
    limit: Option<usize>,
}

#[derive(Serialize)]
struct LockRow {
    lock: String,
    holder: u64,
    token: u64,
    lock_delay: bool,
    /// The holder's lease time left by the leader's timers; `None` on a
    /// follower.
    lease_left_ms: Option<u64>,
    waiters: Vec<u64>,
    waiter_count: usize,
}

#[derive(Serialize)]
struct Page<T> {
    rows: Vec<T>,
    /// The cursor of the next page (`after`), if there is one.
    next: Option<String>,
    leading: bool,
}

fn millis(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The first `limit` of `items`, and the cursor of the next page (from the
/// last one taken) if any is left.
fn page<T>(
    items: impl Iterator<Item = T>,
    limit: usize,
    cursor: impl Fn(&T) -> String,
) -> (Vec<T>, Option<String>) {
    let mut taken: Vec<T> = items.take(limit + 1).collect();
    let more = taken.len() > limit;
    taken.truncate(limit);
    let next = more.then(|| taken.last().map(&cursor)).flatten();
    (taken, next)
}

/// A page of held locks named `prefix...` after the cursor `after`, in name
/// order: a walk of the table's ordered map from the cursor, so it costs
/// the page, not the table.
fn lock_page(
    table: &LockTable,
    prefix: &str,
    after: &str,
    limit: usize,
) -> (Vec<LockInfo>, Option<String>) {
    // A lock named exactly `prefix` comes first; `locks_after` starts past
    // its argument.
    let from_prefix = after < prefix;
    let exact = if from_prefix {
        table.lock(prefix)
    } else {
        None
    };
    let start = if from_prefix { prefix } else { after };
    let locks = exact
        .into_iter()
        .chain(table.locks_after(start))
        .take_while(|info| info.name.starts_with(prefix));
    page(locks, limit, |info| info.name.clone())
}

/// Held locks whose names start with `prefix`, after the cursor `after`.
async fn locks(
    State(node): State<Node>,
    credentials: Credentials,
    query: Result<Query<LocksQuery>, QueryRejection>,
) -> Reply<Page<LockRow>> {
    let caller = reader(&node, &credentials, None).await?;
    let Query(LocksQuery {
        prefix,
        after,
        limit,
    }) = query?;
    let limit = page_size(limit)?;
    let max = Limits::STANDARD.max_name_bytes;
    if prefix.len() > max || after.len() > max {
        return Err(invalid(format!(
            "prefix and after are lock names or their beginnings: at most {max} bytes"
        )));
    }
    let (mut infos, next) = {
        let state = node.table.read().expect("state lock poisoned");
        lock_page(&state.table, &prefix, &after, limit)
    };
    node.retain_readable(&caller, &mut infos);
    let rows = infos
        .into_iter()
        .map(|info| LockRow {
            lease_left_ms: node.leases.remaining(info.holder).map(millis),
            holder: info.holder.0,
            token: info.token.0,
            lock_delay: info.delayed,
            waiter_count: info.waiters.len(),
            waiters: info.waiters.iter().take(MAX_WAITERS).map(|s| s.0).collect(),
            lock: info.name,
        })
        .collect();
    Ok(Json(Page {
        rows,
        next,
        leading: node.leases.is_leading(),
    }))
}

#[derive(Deserialize)]
struct SessionsQuery {
    #[serde(default)]
    after: u64,
    limit: Option<usize>,
}

#[derive(Serialize)]
struct SessionRow {
    session: u64,
    ttl_ms: u64,
    lease_left_ms: Option<u64>,
    held: usize,
    waiting: usize,
}

/// Live sessions with ids above `after`.
async fn sessions(
    State(node): State<Node>,
    credentials: Credentials,
    query: Result<Query<SessionsQuery>, QueryRejection>,
) -> Reply<Page<SessionRow>> {
    let _caller = reader(&node, &credentials, None).await?;
    let Query(SessionsQuery { after, limit }) = query?;
    let limit = page_size(limit)?;
    let (infos, next) = {
        let state = node.table.read().expect("state lock poisoned");
        let sessions = state.table.sessions_after(SessionId(after));
        page(sessions, limit, |info| info.id.0.to_string())
    };
    let rows = infos
        .into_iter()
        .map(|info| SessionRow {
            session: info.id.0,
            ttl_ms: millis(info.ttl),
            lease_left_ms: node.leases.remaining(info.id).map(millis),
            held: info.held,
            waiting: info.waiting,
        })
        .collect();
    Ok(Json(Page {
        rows,
        next,
        leading: node.leases.is_leading(),
    }))
}

#[derive(Deserialize)]
struct HistoryQuery {
    lock: String,
}

#[derive(Serialize)]
struct HistoryRow {
    seq: u64,
    at_ms: u64,
    session: u64,
    token: u64,
    what: deadbolt_core::AuditKind,
    identity: Option<String>,
}

/// The kept audit trail of one lock, oldest first (at most the table's
/// 10 000 records).
async fn history(
    State(node): State<Node>,
    credentials: Credentials,
    query: Result<Query<HistoryQuery>, QueryRejection>,
) -> Reply<Vec<HistoryRow>> {
    let Query(HistoryQuery { lock }) = query?;
    validate_lock_name(&lock).map_err(|err| HttpError::from(ApiError::from(err)))?;
    let _caller = reader(&node, &credentials, Some(&lock)).await?;
    let state = node.table.read().expect("state lock poisoned");
    let rows = state
        .table
        .history(&lock)
        .into_iter()
        .map(|record| HistoryRow {
            seq: record.seq,
            at_ms: record.at_ms,
            session: record.session.0,
            token: record.token.0,
            what: record.what,
            identity: record.identity,
        })
        .collect();
    Ok(Json(rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use deadbolt_core::{AcquireOutcome, Command, Outcome, SecretHash};

    fn table_with<S: AsRef<str>>(locks: impl IntoIterator<Item = S>) -> LockTable {
        let mut table = LockTable::new();
        let opened = table.apply(&Command::OpenSession {
            ttl_ms: 10_000,
            secret: SecretHash([1; 32]),
            owner: None,
        });
        let Ok(Outcome::SessionOpened { session, .. }) = opened.outcome else {
            panic!("no session: {:?}", opened.outcome);
        };
        for lock in locks {
            let lock = lock.as_ref();
            let acquired = table.apply(&Command::Acquire {
                session,
                lock: lock.to_owned(),
                wait: false,
                attempt: 0,
                lock_delay_ms: 0,
            });
            assert!(
                matches!(
                    acquired.outcome,
                    Ok(Outcome::Acquire(AcquireOutcome::Granted { .. }))
                ),
                "{lock}: {:?}",
                acquired.outcome
            );
        }
        table
    }

    fn names(page: &(Vec<LockInfo>, Option<String>)) -> (Vec<&str>, Option<&str>) {
        let names = page.0.iter().map(|info| info.name.as_str()).collect();
        (names, page.1.as_deref())
    }

    #[test]
    fn lock_pages_follow_the_cursor_and_keep_to_the_prefix() {
        let table = table_with(["a", "job", "job/1", "job/2", "job/3", "jobs", "k"]);
        let first = lock_page(&table, "job", "", 2);
        assert_eq!(names(&first), (vec!["job", "job/1"], Some("job/1")));
        let second = lock_page(&table, "job", "job/1", 2);
        assert_eq!(names(&second), (vec!["job/2", "job/3"], Some("job/3")));
        let last = lock_page(&table, "job", "job/3", 2);
        assert_eq!(names(&last), (vec!["jobs"], None));
        assert_eq!(names(&lock_page(&table, "zzz", "", 2)), (vec![], None));
        let all = lock_page(&table, "", "", 50);
        assert_eq!((all.0.len(), all.1), (7, None));
        // Exactly a page left: no next cursor.
        assert_eq!(names(&lock_page(&table, "job/", "", 3)).1, None);
    }

    /// The figure in docs/operations.md ("Dashboard"): a page of a
    /// million-lock table costs a page, not the table. A measurement (it
    /// prints the time; timing is for benchmarks, not assertions), and a
    /// check that each page starts and ends where it should at that size.
    #[test]
    #[ignore = "builds a 1 M-lock table (~7 s): cargo test -p deadbolt-server --lib a_page_of_a_million -- --ignored --nocapture"]
    fn a_page_of_a_million_locks_costs_a_page() {
        let table = table_with((0..1_000_000).map(|i| format!("jobs/{i:07}")));
        for (prefix, after, first, last) in [
            ("", "", 0, MAX_PAGE - 1),
            ("jobs/05", "", 500_000, 500_000 + MAX_PAGE - 1),
            ("jobs/0999", "jobs/0999950", 999_951, 999_999),
        ] {
            let started = std::time::Instant::now();
            let (rows, _) = lock_page(&table, prefix, after, MAX_PAGE);
            let took = started.elapsed();
            eprintln!(
                "prefix {prefix:?} after {after:?}: {} rows in {took:?}",
                rows.len()
            );
            let names: Vec<&str> = rows.iter().map(|info| info.name.as_str()).collect();
            assert_eq!(
                names.first().copied(),
                Some(format!("jobs/{first:07}").as_str())
            );
            assert_eq!(
                names.last().copied(),
                Some(format!("jobs/{last:07}").as_str())
            );
        }
    }
}
