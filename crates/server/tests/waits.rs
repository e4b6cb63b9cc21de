//! Blocking acquires with a timeout, and group commit, on tokio's paused
//! clock against an embedded node.
//!
//! Why: no real-process test looks at a wait's timeout (the CLI tests only
//! use timeouts to keep their workers moving), and "a timed-out waiter
//! leaves the queue at its timeout, not before, and a grant that wins the
//! race is returned" is a question of milliseconds, which only the paused
//! clock answers exactly. Group commit (the proposer's batching) is
//! likewise only measured by benchmarks; here it is asserted.

use crate::common;

use common::{
    acquire, acquire_within, lock_state, metric, open_session, release, wait_for_waiters, Cluster,
    ErrorKind,
};
use std::time::Duration;
use tokio::time::Instant;

const LONG: Duration = Duration::from_secs(60);

/// A wait with a timeout stays in the queue until the timeout, then leaves
/// it (answered `wait_timeout`), and the lock stays its holder's.
#[tokio::test(start_paused = true)]
async fn a_wait_leaves_the_queue_at_its_timeout_and_not_before() {
    let cluster = Cluster::form(1).await;
    let api = cluster.api(1);
    let holder = open_session(&api, LONG).await;
    let waiter = open_session(&api, LONG).await;
    let held = acquire(&api, &holder, "job", false, 1).await.unwrap();

    let started = Instant::now();
    let wait = tokio::spawn({
        let (api, waiter) = (api.clone(), waiter.clone());
        async move { acquire_within(&api, &waiter, "job", true, Some(Duration::from_secs(2)), 2).await }
    });
    wait_for_waiters(&api, "job", 1).await;
    tokio::time::sleep_until(started + Duration::from_millis(1900)).await;
    assert!(!wait.is_finished(), "the wait ended before its timeout");
    let state = lock_state(&api, "job").await.unwrap();
    assert_eq!(state.waiter_session_ids, [waiter.id]);

    let timed_out = wait.await.unwrap().unwrap_err();
    assert_eq!(timed_out.kind, ErrorKind::WaitTimeout, "{timed_out:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2) && waited < Duration::from_millis(2100),
        "answered after {waited:?}"
    );
    let state = lock_state(&api, "job").await.unwrap();
    assert_eq!((state.holder_session_id, state.token), (holder.id, held));
    assert!(
        state.waiter_session_ids.is_empty(),
        "the timed-out wait kept its queue place: {state:?}"
    );
}

/// A grant that comes before the timeout is returned, with its token.
#[tokio::test(start_paused = true)]
async fn a_grant_before_the_timeout_is_returned() {
    let cluster = Cluster::form(1).await;
    let api = cluster.api(1);
    let holder = open_session(&api, LONG).await;
    let waiter = open_session(&api, LONG).await;
    let held = acquire(&api, &holder, "job", false, 1).await.unwrap();
    let wait = tokio::spawn({
        let (api, waiter) = (api.clone(), waiter.clone());
        async move { acquire_within(&api, &waiter, "job", true, Some(Duration::from_secs(2)), 2).await }
    });
    wait_for_waiters(&api, "job", 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    release(&api, &holder, "job", held).await;
    let granted = wait.await.unwrap().expect("granted before the timeout");
    assert!(granted > held);
    let state = lock_state(&api, "job").await.unwrap();
    assert_eq!((state.holder_session_id, state.token), (waiter.id, granted));
}

/// Concurrent commands share log entries: 200 sessions opened at once take
/// far fewer than 200 entries, and every one of them is answered with its
/// own session.
#[tokio::test(start_paused = true)]
async fn concurrent_commands_are_committed_in_few_entries() {
    const OPENS: usize = 200;
    let cluster = Cluster::form(1).await;
    let api = cluster.api(1);
    let before = api.health().last_applied_index;
    let opens: Vec<_> = (0..OPENS)
        .map(|_| {
            let api = api.clone();
            tokio::spawn(async move { open_session(&api, LONG).await.id })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    for open in opens {
        ids.insert(open.await.unwrap());
    }
    assert_eq!(ids.len(), OPENS, "every open got a session of its own");
    let entries = api.health().last_applied_index - before;
    assert!(
        entries <= OPENS as u64 / 10,
        "{OPENS} concurrent opens took {entries} log entries"
    );
}

/// While a batch waits for a follower, the leader's log takes the next ones
/// (a few, then the rest queue), and they commit in the order they were
/// sent: each write here opens a session, whose id is its place in the log.
#[tokio::test(start_paused = true)]
async fn batches_go_into_the_log_while_one_waits_for_a_quorum_and_commit_in_order() {
    const WRITES: usize = 12;
    let cluster = Cluster::form(3).await;
    let leader = cluster.leader().await;
    let api = cluster.api(leader);
    let raft = cluster.raft(leader);
    let last_index = || raft.metrics().borrow().last_log_index.unwrap();
    let before = last_index();
    cluster.net.cut_all(&[1, 2, 3]);
    let mut writes = Vec::new();
    for _ in 0..WRITES {
        writes.push(tokio::spawn({
            let api = api.clone();
            async move { open_session(&api, LONG).await.id }
        }));
        // Each write is a batch of its own.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let in_log = last_index() - before;
    let queued = metric(&api, "deadbolt_proposer_queued_commands").await;
    assert!(
        in_log > 1,
        "only {in_log} batch went into the leader's log while it waited for a quorum"
    );
    assert!(
        queued >= 1.0 && in_log + queued as u64 == WRITES as u64,
        "{in_log} in the log, {queued} queued: the batches in flight are not bounded"
    );

    cluster.net.heal();
    let mut ids = Vec::new();
    for write in writes {
        ids.push(write.await.unwrap());
    }
    assert!(
        ids.windows(2).all(|pair| pair[0] < pair[1]),
        "writes sent one after another committed out of order: {ids:?}"
    );
}

/// A contended lock's hand-off chain sends two commands per grant: the
/// holder's release and the previous holder's next acquire, which only
/// joins the queue. The acquire waits up to a millisecond for company, so
/// the release that comes meanwhile shares its log entry (one append, not
/// two); the queue order stays the order of arrival, and an acquire that
/// could be granted, or a queue join that nothing follows, is not held
/// longer.
#[tokio::test(start_paused = true)]
async fn a_queue_join_shares_the_log_entry_of_the_release_that_follows_it() {
    let cluster = Cluster::form(1).await;
    let api = cluster.api(1);
    let raft = cluster.raft(1);
    let last_index = || raft.metrics().borrow().last_log_index.unwrap();
    let holder = open_session(&api, LONG).await;
    let first = open_session(&api, LONG).await;
    let second = open_session(&api, LONG).await;

    // A free lock is granted at once.
    let asked = Instant::now();
    let held = acquire(&api, &holder, "job", true, 1).await.unwrap();
    assert_eq!(asked.elapsed(), Duration::ZERO, "a grant was held back");

    // A queue join that nothing follows goes into the log after the hold.
    let asked = Instant::now();
    let first_wait = tokio::spawn({
        let (api, first) = (api.clone(), first.clone());
        async move { acquire(&api, &first, "job", true, 2).await }
    });
    wait_for_waiters(&api, "job", 1).await;
    let queued_after = asked.elapsed();
    assert!(
        queued_after >= Duration::from_millis(1) && queued_after <= Duration::from_millis(2),
        "queued after {queued_after:?}"
    );

    // A queue join, then the release within the hold: one entry for both.
    let before = last_index();
    let second_wait = tokio::spawn({
        let (api, second) = (api.clone(), second.clone());
        async move { acquire(&api, &second, "job", true, 3).await }
    });
    tokio::time::sleep(Duration::from_micros(300)).await;
    assert_eq!(last_index(), before, "the queue join went to the log alone");
    release(&api, &holder, "job", held).await;
    assert_eq!(
        last_index(),
        before + 1,
        "the queue join and the release took two entries"
    );

    let granted = first_wait
        .await
        .unwrap()
        .expect("the first waiter is granted");
    assert!(granted > held);
    let state = lock_state(&api, "job").await.unwrap();
    assert_eq!(state.holder_session_id, first.id);
    assert_eq!(
        state.waiter_session_ids,
        vec![second.id],
        "queued out of order"
    );
    release(&api, &first, "job", granted).await;
    assert!(second_wait.await.unwrap().expect("then the second") > granted);
}
