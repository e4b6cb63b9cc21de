//! PostgreSQL advisory locks against the real server of
//! `scripts/postgres.sh` (`DEADBOLT_TEST_POSTGRES_URL`).

mod common;

use common::{contract, lost_within, Expect};
use deadbolt_backends::{ErrorKind, Lost};
use deadbolt_testkit::peers;
use std::time::Duration;
use tokio_postgres::NoTls;

const TTL: Duration = Duration::from_secs(2);

#[tokio::test]
async fn postgres_keeps_the_contract_with_sequence_tokens() {
    let Some(url) = peers::postgres_url() else {
        return;
    };
    contract(&url, TTL, Expect::Fencing).await;
}

/// The lease is the connection: when the server ends the holder's session
/// (here `pg_terminate_backend`, as `idle_session_timeout` would), lost()
/// fires and someone else can take the lock.
#[tokio::test]
async fn a_terminated_connection_loses_the_lock() {
    let Some(url) = peers::postgres_url() else {
        return;
    };
    let common::Renewed {
        name, guard, rival, ..
    } = common::held_past_its_ttl(&url, TTL, "pg-terminate").await;

    let (admin, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(connection);
    let terminated: bool = admin
        .query_one(
            "SELECT pg_terminate_backend(l.pid) FROM pg_locks l \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
               AND l.classid::bigint = (hashtextextended($1, 0) >> 32) & 4294967295 \
               AND l.objid::bigint = hashtextextended($1, 0) & 4294967295",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    assert!(terminated);
    let reason = lost_within(guard.lost(Duration::ZERO), TTL).await;
    assert!(matches!(reason, Lost::Rejected(_)), "{reason:?}");
    let release = guard.release().await.unwrap_err();
    assert_eq!(release.kind(), ErrorKind::LockLost, "{release}");
    // The server frees the lock as the terminated backend exits, which may
    // be a moment after the client saw its socket close.
    rival.lock_timeout(&name, TTL).await.unwrap();
}
