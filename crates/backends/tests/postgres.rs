//! PostgreSQL advisory locks against the real server of
//! `scripts/postgres.sh` (`DEADBOLT_TEST_POSTGRES_URL`).

use crate::common;

use common::{contract, lost_within, Expect};
use deadbolt_backends::{ErrorKind, Lost, Mode};
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

/// TLS: a server of the test's own that takes TLS connections only, with
/// a certificate for 127.0.0.1 (not for `localhost`) from a CA made here.
/// `verify-full` with the CA locks; without the CA, or under a name the
/// certificate does not carry, it is refused at once, naming the fix;
/// `verify-ca` takes the other name, `require` any certificate; plain TCP
/// is refused by the server (so the locks above went over TLS).
#[tokio::test]
async fn sslmode_verify_full_locks_over_tls_with_the_ca_of_sslrootcert() {
    let certs = common::certificates(&["127.0.0.1"]);
    let file = |name: &str| certs.path().join(name);
    let Some(server) = peers::postgres_tls(&file("server.pem"), &file("server-key.pem")) else {
        return;
    };
    let ca = file("ca.pem");
    let url = |host: &str, query: &str| {
        format!(
            "postgres://deadbolt@{host}:{}/postgres?{query}",
            server.port
        )
    };
    let verify_full = url(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    );
    contract(&verify_full, TTL, Expect::Fencing).await;
    for query in [
        format!("sslmode=verify-ca&sslrootcert={}", ca.display()),
        format!("sslmode=require&sslrootcert={}", ca.display()),
    ] {
        let locker = deadbolt_backends::Locker::connect(&url("localhost", &query))
            .await
            .unwrap();
        let session = locker.open_session(TTL).await.unwrap();
        let guard = session.try_lock("tls-verify-ca").await.unwrap().unwrap();
        guard.release().await.unwrap();
    }
    let unverified = url("127.0.0.1", "sslmode=require");
    let locker = deadbolt_backends::Locker::connect(&unverified)
        .await
        .unwrap();
    locker.open_session(TTL).await.unwrap();

    for (url, says) in [
        (url("127.0.0.1", "sslmode=verify-full"), "sslrootcert=PATH"),
        (
            url(
                "localhost",
                &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
            ),
            "host name",
        ),
        (url("127.0.0.1", "connect_timeout=5"), "no encryption"),
    ] {
        let locker = deadbolt_backends::Locker::connect(&url).await.unwrap();
        let error = locker.open_session(TTL).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Refused, "{url}: {error}");
        assert!(error.to_string().contains(says), "{url}: {error}");
    }
    let missing = url(
        "127.0.0.1",
        "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
    );
    let error = deadbolt_backends::Locker::connect(&missing)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
    assert!(error.to_string().contains("/nonexistent/ca.pem"), "{error}");
}

/// `Mode::Shared` is PostgreSQL's shared advisory lock: readers hold it
/// together, a writer waits for them and they for it, and every grant
/// takes the next token from the sequence.
#[tokio::test]
async fn shared_holders_lock_together_and_a_writer_waits_for_them() {
    let Some(url) = peers::postgres_url() else {
        return;
    };
    let locker = deadbolt_backends::Locker::connect(&url).await.unwrap();
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(locker.open_session(TTL).await.unwrap());
    }
    let name = format!("pg-shared-{}", std::process::id());
    let token = |guard: &deadbolt_backends::Guard| guard.token().fencing().unwrap();
    let first = sessions[0]
        .lock_in(&name, Mode::Shared, None)
        .await
        .unwrap();
    let second = sessions[1].try_lock_in(&name, Mode::Shared).await.unwrap();
    let second = second.expect("readers share");
    assert!(token(&second) > token(&first));
    let writer = sessions[2].try_lock(&name).await.unwrap();
    assert!(writer.is_none(), "a writer beside readers");
    let last_read = token(&second);
    first.release().await.unwrap();
    second.release().await.unwrap();
    let writer = sessions[2].lock_timeout(&name, TTL).await.unwrap();
    assert!(token(&writer) > last_read);
    let reader = sessions[0].try_lock_in(&name, Mode::Shared).await.unwrap();
    assert!(reader.is_none(), "a reader beside the writer");
    writer.release().await.unwrap();
}
