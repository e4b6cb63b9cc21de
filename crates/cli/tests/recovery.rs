//! Restarts, clean and `kill -9`: nothing acknowledged is lost, no token is
//! handed out twice, and tokens keep growing.
//!
//! What only timers decide (the 3 s grace of an acquire whose caller went
//! away, a dropped wait keeping its place for the retry, the waits a restart
//! cut and nobody retries) is tested on tokio's paused clock against
//! embedded nodes, in `crates/server/tests/abandoned_calls.rs`; here stays
//! what needs real processes: signals, kill -9, sockets, the client.

mod common;

use common::{signal, TestServer};
use deadbolt_client::{Client, ErrorKind, Session};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One acknowledged hold of a lock by a worker: from the moment the grant
/// was acknowledged until the worker sent its release (or the end).
#[derive(Debug, Clone)]
struct Hold {
    lock: String,
    token: u64,
    granted: Instant,
    released: Option<Instant>,
}

async fn worker(
    session: Session,
    id: usize,
    stop: Arc<AtomicBool>,
) -> (Vec<Hold>, Option<deadbolt_client::LockGuard>) {
    let mut holds = Vec::new();
    let mut round = id;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        let lock = format!("crash-{}", round % 3);
        // Blocking acquire; the client retries it (idempotently) across the
        // crash, so it may be granted by the restarted server. The timeout
        // lets waiters notice `stop` while others keep their locks.
        let Ok(guard) = session
            .lock_timeout(&lock, Duration::from_millis(500))
            .await
        else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        holds.push(Hold {
            lock,
            token: guard.token(),
            granted: Instant::now(),
            released: None,
        });
        if stop.load(Ordering::Relaxed) {
            return (holds, Some(guard));
        }
        holds.last_mut().unwrap().released = Some(Instant::now());
        // An error here (lost reply across the crash) leaves the lock to the
        // session's retry or expiry; this worker no longer uses it.
        let _ = guard.release().await;
    }
    (holds, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_under_load_loses_no_acknowledged_grant_and_never_reissues_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = TestServer::start(&data);
    let client = Client::connect([server.endpoint()]).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for id in 0..8 {
        // Long enough that no session can expire across the restart.
        let session = client.open_session(Duration::from_secs(60)).await.unwrap();
        workers.push((
            session.clone(),
            tokio::spawn(worker(session, id, stop.clone())),
        ));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    server.kill9();
    let before_restart = client.health().await;
    assert!(before_restart.is_err(), "the server is dead");
    let server = TestServer::start_on(&data, server.addr);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.store(true, Ordering::Relaxed);

    let mut all = Vec::new();
    let mut still_held = Vec::new();
    for (session, task) in workers {
        let (holds, guard) = task.await.unwrap();
        assert!(
            !session.is_lost(),
            "session {} lost across the restart",
            session.id()
        );
        // Per lock: a grant the crash cut off before its answer arrived is
        // still this session's, and a later acquire of that lock is
        // answered with it, older than the worker's grants of other locks
        // since (acquire is idempotent). What must never go back is a lock's
        // own token.
        for lock in ["crash-0", "crash-1", "crash-2"] {
            let tokens: Vec<u64> = holds
                .iter()
                .filter(|h| h.lock == lock)
                .map(|h| h.token)
                .collect();
            assert!(
                tokens.windows(2).all(|w| w[0] < w[1]),
                "tokens of {lock} went back for one worker: {tokens:?}"
            );
        }
        all.extend(holds);
        if let Some(guard) = guard {
            still_held.push((session, guard));
        }
    }
    assert!(
        all.len() > 20,
        "too little load to mean anything: {} grants",
        all.len()
    );

    // Never the same token twice.
    let unique: HashSet<u64> = all.iter().map(|h| h.token).collect();
    assert_eq!(unique.len(), all.len(), "a token was granted twice");

    // Never two acknowledged holders of one lock at the same moment.
    let end = Instant::now();
    for a in &all {
        for b in &all {
            if a.lock == b.lock && a.token < b.token {
                assert!(
                    a.released.unwrap_or(end) <= b.granted,
                    "{} held with token {} and {} at once",
                    a.lock,
                    a.token,
                    b.token
                );
            }
        }
    }

    // Grants still held survived the crash, with their tokens.
    let client = server.client().await;
    for (session, guard) in still_held {
        let state = client
            .lock_status(guard.name())
            .await
            .unwrap()
            .expect("still held");
        assert_eq!(
            (state.holder_session_id, state.token),
            (session.id(), guard.token())
        );
        guard.release().await.unwrap();
    }

    // And the counter only moved forward.
    let max_token = all.iter().map(|h| h.token).max().unwrap();
    let health = client.health().await.unwrap();
    assert!(
        health.next_token > max_token,
        "{} <= {max_token}",
        health.next_token
    );
    let fresh = client.open_session(Duration::from_secs(5)).await.unwrap();
    let guard = fresh.lock("crash-after").await.unwrap();
    assert!(guard.token() > max_token);
}

/// Sessions whose leases outlast any test.
async fn long_sessions<const N: usize>(client: &Client) -> [Session; N] {
    let mut sessions = Vec::with_capacity(N);
    for _ in 0..N {
        sessions.push(client.open_session(Duration::from_secs(30)).await.unwrap());
    }
    sessions.try_into().expect("N sessions")
}

async fn wait_for_waiters(client: &Client, lock: &str, count: usize) {
    loop {
        let state = client.lock_status(lock).await.unwrap();
        if state.is_some_and(|s| s.waiter_session_ids.len() >= count) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clean_restart_keeps_holders_queues_and_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut server = TestServer::start(&data);
    let client = Client::connect([server.endpoint()]).await.unwrap();
    let [holder, first, second] = long_sessions(&client).await;
    let held = holder.lock("queue").await.unwrap();
    let first_wait = tokio::spawn({
        let first = first.clone();
        async move { first.lock("queue").await }
    });
    wait_for_waiters(&client, "queue", 1).await;
    let second_wait = tokio::spawn({
        let second = second.clone();
        async move { second.lock("queue").await }
    });
    wait_for_waiters(&client, "queue", 2).await;

    let status = server.terminate();
    assert!(status.success(), "graceful shutdown exited with {status}");
    let server = TestServer::start_on(&data, server.addr);
    let client = server.client().await;

    let state = client.lock_status("queue").await.unwrap().unwrap();
    assert_eq!(
        (state.holder_session_id, state.token),
        (holder.id(), held.token())
    );
    assert_eq!(state.waiter_session_ids, vec![first.id(), second.id()]);

    // The waiters' blocked acquires were cut by the shutdown and retried:
    // they kept their places, and the grants follow the queue.
    held.release().await.unwrap();
    let granted_first = first_wait.await.unwrap().unwrap();
    let first_token = granted_first.token();
    assert!(first_token > state.token);
    granted_first.release().await.unwrap();
    let granted_second = second_wait.await.unwrap().unwrap();
    assert!(granted_second.token() > first_token);
}

/// With frequent snapshots the log is compacted, and a crash restarts from
/// snapshot + remaining log with every holder, waiter and token intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_from_a_compacted_log_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let flags = ["--snapshot-every", "20"];
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let mut server = TestServer::start_with(&data, addr, &flags);
    let client = server.client().await;
    let [holder, waiter] = long_sessions(&client).await;
    let mut last_token = 0;
    for round in 0..150 {
        let guard = holder.lock(&format!("churn-{}", round % 7)).await.unwrap();
        assert!(guard.token() > last_token);
        last_token = guard.token();
        guard.release().await.unwrap();
    }
    let kept = holder.lock("kept").await.unwrap();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.lock("kept").await }
    });
    wait_for_waiters(&client, "kept", 1).await;
    let before = client.health().await.unwrap();
    assert!(
        before.purged_index > 0,
        "the log was never compacted: {before:?}"
    );

    server.kill9();
    let server = TestServer::start_with(&data, addr, &flags);
    let client = server.client().await;
    let after = client.health().await.unwrap();
    // Not equal: the new leader's first batch raises the counter to its
    // wall clock (tokens never fall behind it).
    assert!(after.next_token >= before.next_token);
    assert!(after.snapshot_index > 0);
    let state = client.lock_status("kept").await.unwrap().unwrap();
    assert_eq!(
        (state.holder_session_id, state.token),
        (holder.id(), kept.token())
    );
    assert_eq!(state.waiter_session_ids, vec![waiter.id()]);

    let kept_token = kept.token();
    kept.release().await.unwrap();
    let granted = waiting.await.unwrap().unwrap();
    assert!(granted.token() > kept_token);
    assert!(granted.token() >= after.next_token);
}

/// A caller that gives up on a blocking acquire (drops the future) must not
/// leave its live session holding a lock nobody knows about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_given_up_by_its_caller_does_not_leak_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let client = server.client().await;
    let [holder, impatient, next] = long_sessions(&client).await;
    let held = holder.lock("leak").await.unwrap();
    let gave_up = tokio::time::timeout(Duration::from_millis(300), impatient.lock("leak")).await;
    assert!(
        gave_up.is_err(),
        "the lock was held, the wait should not have finished"
    );
    // Freed within the grace period: the grant goes to the impatient
    // session, whose caller is gone...
    held.release().await.unwrap();
    let state = client.lock_status("leak").await.unwrap().unwrap();
    assert_eq!(state.holder_session_id, impatient.id());
    // ...and is handed back once the grace period is over.
    let taken = tokio::time::timeout(Duration::from_secs(15), next.lock("leak"))
        .await
        .expect("the abandoned grant was never given back")
        .unwrap();
    assert!(taken.token() > state.token);
    assert!(
        !impatient.is_lost(),
        "only the grant is given back, not the session"
    );
}

/// A blocking acquire waiting on a server that stops answering (frozen by
/// SIGSTOP) ends once the session's lease is lost, with that reason, rather
/// than waiting for an answer that may never come. A request has no timer
/// of its own: the session's watchdog ends the lease at its deadline, and
/// the request hears it from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_on_a_frozen_server_ends_with_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(&dir.path().join("data"));
    let client = server.client().await;
    let [holder] = long_sessions(&client).await;
    let _held = holder.lock("frozen").await.unwrap();
    let ttl = Duration::from_secs(2);
    let waiter = client.open_session(ttl).await.unwrap();
    let waiting = tokio::spawn(async move {
        let outcome = waiter.lock("frozen").await;
        (outcome.map(|guard| guard.token()), waiter.lease_deadline())
    });
    wait_for_waiters(&client, "frozen", 1).await;
    signal(server.pid(), libc::SIGSTOP);
    let frozen_at = Instant::now();
    // A hang guard, far past the lease: the wait ends at the deadline.
    let ended = tokio::time::timeout(ttl * 10, waiting).await;
    signal(server.pid(), libc::SIGCONT);
    let (outcome, deadline) = ended.expect("the wait outlived the lease").unwrap();
    let error = outcome.expect_err("no grant can come from a frozen server");
    assert_eq!(error.kind(), ErrorKind::SessionExpiring, "{error}");
    assert!(
        Instant::now() >= deadline,
        "the wait ended before the lease did ({:?} after the freeze)",
        frozen_at.elapsed()
    );
}
