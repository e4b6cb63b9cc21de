//! Acquires whose callers went away, on tokio's paused clock: what a node
//! gives up after the 3 s grace (`ABANDON_GRACE` in `node/acquire.rs`), what it
//! keeps for a retry, and that it waits the whole grace and no more.
//!
//! Why: these used to be wall-clock tests of real processes
//! (`crates/cli/tests/recovery.rs`), which slept through the grace with
//! margins for a loaded machine (4 s, polls up to 15 and 20 s) and could only
//! say "eventually". Here the grace is measured: not given up at 2.9 s, given
//! up by 3.1 s. A caller going away is its acquire future being dropped,
//! which is what the HTTP and gRPC front ends do when a connection drops and
//! what a `Calls` stream does on `cancel`; the front ends' part stays tested
//! with real processes (`an_acquire_given_up_by_its_caller_does_not_leak_the_lock`
//! goes through the client's stream cancel).

use crate::common;

use common::{acquire, lock_state, open_session, release, wait_for_waiters, Cluster, ErrorKind};
use std::time::Duration;
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(60);

async fn waiters(api: &common::Api, lock: &str) -> Vec<u64> {
    lock_state(api, lock)
        .await
        .map(|state| state.waiter_session_ids)
        .unwrap_or_default()
}

/// A blocking acquire whose caller went away keeps its queue place for the
/// caller's retry, instead of sending it to the back of the queue.
/// (Was `a_dropped_wait_keeps_its_place_for_the_retry` in recovery.rs.)
#[tokio::test(start_paused = true)]
async fn a_dropped_wait_keeps_its_place_for_the_retry() {
    let cluster = Cluster::form(1).await;
    let api = cluster.api(1);
    let holder = open_session(&api, LONG).await;
    let flaky = open_session(&api, LONG).await;
    let patient = open_session(&api, LONG).await;
    let held = acquire(&api, &holder, "fifo", false, 1).await.unwrap();

    let dropped = tokio::spawn({
        let (api, flaky) = (api.clone(), flaky.clone());
        async move { acquire(&api, &flaky, "fifo", true, 10).await }
    });
    wait_for_waiters(&api, "fifo", 1).await;
    dropped.abort();
    let patient_wait = tokio::spawn({
        let (api, patient) = (api.clone(), patient.clone());
        async move { acquire(&api, &patient, "fifo", true, 20).await }
    });
    wait_for_waiters(&api, "fifo", 2).await;

    // The retry (a new attempt id, as the client sends) comes well within
    // the grace period...
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retry = tokio::spawn({
        let (api, flaky) = (api.clone(), flaky.clone());
        async move { acquire(&api, &flaky, "fifo", true, 11).await }
    });
    // ...and the place is still first in line after the grace is over.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(waiters(&api, "fifo").await, [flaky.id, patient.id]);

    release(&api, &holder, "fifo", held).await;
    let first = retry.await.unwrap().expect("the retry is granted first");
    assert!(first > held);
    release(&api, &flaky, "fifo", first).await;
    let second = patient_wait.await.unwrap().unwrap();
    assert!(second > first);
}

/// A dropped wait that nobody retries is given up when the grace is over,
/// not before; the session itself lives on.
#[tokio::test(start_paused = true)]
async fn a_dropped_wait_nobody_retries_is_given_up_after_the_grace_and_not_before() {
    let cluster = Cluster::form(1).await;
    let api = cluster.api(1);
    let holder = open_session(&api, LONG).await;
    let gone = open_session(&api, LONG).await;
    let patient = open_session(&api, LONG).await;
    let held = acquire(&api, &holder, "fifo", false, 1).await.unwrap();
    let dropped = tokio::spawn({
        let (api, gone) = (api.clone(), gone.clone());
        async move { acquire(&api, &gone, "fifo", true, 10).await }
    });
    wait_for_waiters(&api, "fifo", 1).await;
    let patient_wait = tokio::spawn({
        let (api, patient) = (api.clone(), patient.clone());
        async move { acquire(&api, &patient, "fifo", true, 20).await }
    });
    wait_for_waiters(&api, "fifo", 2).await;

    dropped.abort();
    let went_away = Instant::now();
    tokio::time::sleep_until(went_away + Duration::from_millis(2900)).await;
    assert_eq!(
        waiters(&api, "fifo").await,
        [gone.id, patient.id],
        "given up before the grace was over"
    );
    tokio::time::sleep_until(went_away + Duration::from_millis(3100)).await;
    assert_eq!(waiters(&api, "fifo").await, [patient.id]);

    release(&api, &holder, "fifo", held).await;
    let granted = patient_wait.await.unwrap().unwrap();
    assert!(granted > held);
    assert_eq!(api.health().sessions, 3, "only the wait was given up");
}

/// Two thousand waiting callers gone at once are given up by the node's one
/// abandonment task, a bounded number of proposals at a time, when the
/// grace is over. They used to be two thousand tasks, each proposing in the
/// same instant.
#[tokio::test(start_paused = true)]
async fn two_thousand_dropped_waits_are_one_task_not_two_thousand() {
    const WAITERS: usize = 2_000;
    const LOCKS: usize = 20;
    let cluster = Cluster::form(1).await;
    let api = cluster.api(1);
    let holder = open_session(&api, LONG).await;
    let lock_name = |i: usize| format!("busy-{}", i % LOCKS);
    for lock in 0..LOCKS {
        acquire(&api, &holder, &lock_name(lock), false, 1)
            .await
            .unwrap();
    }
    let sessions = futures::future::join_all((0..WAITERS).map(|_| open_session(&api, LONG))).await;
    let runtime = tokio::runtime::Handle::current().metrics();
    let before = runtime.num_alive_tasks();
    let waiting: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, session)| {
            let (api, session, lock) = (api.clone(), session.clone(), lock_name(i));
            tokio::spawn(async move { acquire(&api, &session, &lock, true, 10).await })
        })
        .collect();
    for lock in 0..LOCKS {
        wait_for_waiters(&api, &lock_name(lock), WAITERS / LOCKS).await;
    }

    for wait in &waiting {
        wait.abort();
    }
    for wait in waiting {
        assert!(wait.await.unwrap_err().is_cancelled());
    }
    let went_away = Instant::now();
    let mut most = runtime.num_alive_tasks();
    loop {
        let mut left = 0;
        for lock in 0..LOCKS {
            left += waiters(&api, &lock_name(lock)).await.len();
        }
        if left == 0 {
            break;
        }
        assert!(
            went_away.elapsed() < Duration::from_secs(4),
            "{left} of {WAITERS} dropped waits still queued a second after the grace"
        );
        most = most.max(runtime.num_alive_tasks());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        went_away.elapsed() >= Duration::from_secs(3),
        "given up before the grace was over"
    );
    assert!(
        most <= before,
        "{most} tasks alive while {WAITERS} dropped waits awaited their grace (before: {before})"
    );
}

/// A grant that came after its caller went away (the lock freed within the
/// grace) is handed back when the grace is over: a live session must not
/// hold a lock nobody knows about. (The node's side of
/// `an_acquire_given_up_by_its_caller_does_not_leak_the_lock`, which stays
/// in recovery.rs for the client's stream cancel.)
#[tokio::test(start_paused = true)]
async fn a_grant_whose_caller_went_away_is_handed_back_after_the_grace() {
    let cluster = Cluster::form(1).await;
    let api = cluster.api(1);
    let holder = open_session(&api, LONG).await;
    let impatient = open_session(&api, LONG).await;
    let next = open_session(&api, LONG).await;
    let held = acquire(&api, &holder, "leak", false, 1).await.unwrap();
    let gave_up = tokio::spawn({
        let (api, impatient) = (api.clone(), impatient.clone());
        async move { acquire(&api, &impatient, "leak", true, 30).await }
    });
    wait_for_waiters(&api, "leak", 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    gave_up.abort();
    let went_away = Instant::now();

    // Freed within the grace: the grant goes to the caller that went away...
    release(&api, &holder, "leak", held).await;
    let state = lock_state(&api, "leak").await.expect("handed on");
    assert_eq!(state.holder_session_id, impatient.id);
    let next_wait = tokio::spawn({
        let (api, next) = (api.clone(), next.clone());
        async move { acquire(&api, &next, "leak", true, 40).await }
    });
    wait_for_waiters(&api, "leak", 1).await;

    // ...kept for a retry until the grace is over, then handed back.
    tokio::time::sleep_until(went_away + Duration::from_millis(2900)).await;
    assert_eq!(
        lock_state(&api, "leak").await.map(|s| s.holder_session_id),
        Some(impatient.id),
        "handed back before the grace was over"
    );
    tokio::time::sleep_until(went_away + Duration::from_millis(3100)).await;
    assert!(
        next_wait.is_finished(),
        "the abandoned grant was never given back"
    );
    let taken = next_wait.await.unwrap().unwrap();
    assert!(taken > state.token);
    assert_eq!(api.health().sessions, 3, "only the grant was given back");
}

/// Waits whose calls a restart cut are kept for the retries: the one whose
/// client retries keeps its place, the one nobody retries is given up 3 s
/// after the node leads again, and the lock never goes to the session
/// nobody waits in. (Was `a_wait_nobody_retries_after_a_restart_is_given_up`
/// in recovery.rs; a graceful restart of a real process, the client's
/// retries included, stays tested by `clean_restart_keeps_holders_queues_and_tokens`.)
#[tokio::test(start_paused = true)]
async fn after_a_restart_a_wait_nobody_retries_is_given_up_and_a_retried_one_kept() {
    let mut cluster = Cluster::form(1).await;
    let api = cluster.api(1);
    let holder = open_session(&api, LONG).await;
    let gone = open_session(&api, LONG).await;
    let live = open_session(&api, LONG).await;
    let held = acquire(&api, &holder, "orphan", false, 1).await.unwrap();
    let mut cut = Vec::new();
    for (session, attempt) in [(&gone, 50), (&live, 60)] {
        cut.push(tokio::spawn({
            let (api, session) = (api.clone(), session.clone());
            async move { acquire(&api, &session, "orphan", true, attempt).await }
        }));
        wait_for_waiters(&api, "orphan", cut.len()).await;
    }

    cluster.restart(1).await;
    for call in cut {
        let err = call.await.unwrap().unwrap_err();
        assert_eq!(err.kind, ErrorKind::Unavailable, "{err:?}");
    }
    cluster.leader().await;
    let leading = Instant::now();
    let api = cluster.api(1);
    let live_retry = tokio::spawn({
        let (api, live) = (api.clone(), live.clone());
        async move { acquire(&api, &live, "orphan", true, 61).await }
    });

    tokio::time::sleep_until(leading + Duration::from_millis(2900)).await;
    assert_eq!(waiters(&api, "orphan").await, [gone.id, live.id]);
    tokio::time::sleep_until(leading + Duration::from_millis(3100)).await;
    assert_eq!(
        waiters(&api, "orphan").await,
        [live.id],
        "the unclaimed wait was not given up"
    );

    release(&api, &holder, "orphan", held).await;
    let granted = live_retry.await.unwrap().unwrap();
    release(&api, &live, "orphan", granted).await;
    assert_eq!(
        lock_state(&api, "orphan").await,
        None,
        "the lock went to the session nobody waits in"
    );
    assert_eq!(api.health().sessions, 3, "only the wait was given up");
}
