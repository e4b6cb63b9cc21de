//! One targeted test per bug the simulation found (docs/safety.md), named
//! after the seed that found it, each the bug's own scenario on real
//! embedded nodes and tokio's paused clock.
//!
//! Why: a seed replays the run that found a bug only as long as nothing
//! changes the simulation's schedules; after the next change the seed is
//! just another seed. These tests set up the interleaving that each bug
//! needed on purpose (with the harness's partitions and held replication),
//! so the bug stays found. Each fails with its fix reverted. (Seed 100605
//! is also tested where its fix lives: `crates/core/tests/regressions.rs`
//! and `crates/server/src/store/suite.rs`.)

use crate::common;

use common::{
    acquire, keep_alive, lock_state, metric, open_session, release, wait_for_waiters, Cluster,
    ErrorKind,
};
use std::time::Duration;
use tokio::time::Instant;

/// Seed 400056: a node that starts leading gives up the queue places of the
/// waiters whose calls its restart cut, unless they ask again within 3 s.
/// The first version did so with `Abandon` and the wait's attempt id, which
/// also releases a grant nobody asked for after that attempt: a client
/// whose retry reused the attempt id (as the simulation's clients did; the
/// Rust client draws a new one) and was granted in those 3 s lost its lock
/// when the 3 s were up. Only the queue place may go.
#[tokio::test(start_paused = true)]
async fn seed_400056_a_restored_wait_gives_up_only_its_queue_place() {
    let mut cluster = Cluster::form(1).await;
    let api = cluster.api(1);
    let holder = open_session(&api, Duration::from_secs(60)).await;
    let waiter = open_session(&api, Duration::from_secs(60)).await;
    let held = acquire(&api, &holder, "job", false, 1).await.unwrap();
    const ATTEMPT: u64 = 7;
    let first_call = tokio::spawn({
        let (api, waiter) = (api.clone(), waiter.clone());
        async move { acquire(&api, &waiter, "job", true, ATTEMPT).await }
    });
    wait_for_waiters(&api, "job", 1).await;

    // The node restarts: the waiter's call is cut, its queue place is not.
    cluster.restart(1).await;
    let cut = first_call.await.unwrap().unwrap_err();
    assert_eq!(cut.kind, ErrorKind::Unavailable, "{cut:?}");
    cluster.leader().await;
    let started_leading = Instant::now();
    let api = cluster.api(1);

    // The client retries with the same attempt id and is granted within the
    // grace period; its call returns, so nothing watches the wait any more.
    let retry = tokio::spawn({
        let (api, waiter) = (api.clone(), waiter.clone());
        async move { acquire(&api, &waiter, "job", true, ATTEMPT).await }
    });
    wait_for_waiters(&api, "job", 1).await;
    release(&api, &holder, "job", held).await;
    let granted = retry.await.unwrap().expect("the retry is granted");
    assert!(granted > held);
    assert!(
        started_leading.elapsed() < Duration::from_secs(1),
        "the retry must come within the grace period"
    );

    // Past the grace period the grant the client was told of still stands.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let state = lock_state(&api, "job").await;
    let state = state.expect("the granted lock was taken back from the client that holds it");
    assert_eq!((state.holder_session_id, state.token), (waiter.id, granted));
}

/// Seed 100242: openraft restores a leader that restarts quickly as leader
/// of the same term, with no election and no new entry, and its
/// linearizable barrier then waits only for what it knew to be committed
/// before it stopped (its snapshot). Lease tracking started from that
/// half-replayed table: a lease checkpoint (in the snapshot) was applied,
/// the renewal after it not yet, and the session expired with most of its
/// TTL after the acknowledged keepalive still to run. A leader must start
/// tracking leases only once it has applied its whole log.
///
/// The replication of the restarted leader is held back for 100 ms (less
/// than an election timeout), so its leadership check comes back before the
/// log tail is committed and applied: the window the simulation hit by
/// chance.
#[tokio::test(start_paused = true)]
async fn seed_100242_a_restarted_leader_tracks_leases_from_its_whole_log() {
    const TTL: Duration = Duration::from_secs(10);
    let mut cluster = Cluster::form(3).await;
    let leader = cluster.leader().await;
    let api = cluster.api(leader);
    let session = open_session(&api, TTL).await;
    acquire(&api, &session, "job", false, 1).await.unwrap();

    // Quiet for 3/4 of its TTL, the session's lease is checkpointed into
    // the log (every TTL/10 once half of it is gone): 3 s or less left.
    tokio::time::sleep(TTL * 3 / 4).await;
    // A snapshot covers the checkpoints...
    let raft = cluster.raft(leader);
    raft.trigger().snapshot().await.unwrap();
    let applied = raft.metrics().borrow().last_applied;
    raft.wait(Some(Duration::from_secs(5)))
        .snapshot(applied.unwrap(), "snapshot of the checkpointed lease")
        .await
        .unwrap();
    // ...and the keepalive after it renews the lease through the log (a
    // checkpointed lease is renewed only by a committed `LeaseRenewed`).
    let renewed = keep_alive(&api, &session).await.expect("renewed");
    let acknowledged = Instant::now();
    assert_eq!(renewed, TTL);
    let renewal = raft.metrics().borrow().last_applied.unwrap().index;
    assert!(
        renewal > applied.unwrap().index,
        "the renewal is after the snapshot"
    );

    // The leader restarts at once, before anyone else could be elected.
    cluster
        .net
        .hold_replication(leader, Instant::now() + Duration::from_millis(100));
    cluster.restart(leader).await;
    // The window the bug needed is open: the restored leader's leadership
    // check comes back while its log tail (the renewal) is not applied yet.
    let raft = cluster.raft(leader);
    raft.ensure_linearizable()
        .await
        .expect("restored as leader");
    let applied = raft.metrics().borrow().last_applied.unwrap().index;
    assert!(
        applied < renewal,
        "the barrier waited for the renewal (applied {applied}): this test no longer opens \
         the window of seed 100242"
    );
    assert_eq!(cluster.leader().await, leader, "restored as leader");
    let api = cluster.api(leader);

    // The lease runs a full TTL from the acknowledged keepalive.
    tokio::time::sleep_until(acknowledged + TTL - Duration::from_millis(500)).await;
    let state = lock_state(&api, "job").await;
    assert_eq!(
        state.map(|state| state.holder_session_id),
        Some(session.id),
        "the session was gone {:?} after its acknowledged keepalive, before its {TTL:?} TTL ran out",
        acknowledged.elapsed()
    );
    // And it does end once it has run out.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(lock_state(&api, "job").await, None, "the lease never ended");
}

/// Seed 100605: a lease checkpoint decided by the leader of one term waited
/// in its proposer (behind a write that had no quorum) while the node lost
/// leadership and won it again, and reached the log in the later term,
/// after that term's leader had restarted the lease and acknowledged a
/// keepalive directly. The next leader started the session from the stale
/// checkpoint and expired it before its TTL after that keepalive. A timer
/// command must count only in the term that decided it.
#[tokio::test(start_paused = true)]
async fn seed_100605_a_checkpoint_that_waited_through_a_leader_change_changes_no_lease() {
    const TTL: Duration = Duration::from_secs(10);
    let mut cluster = Cluster::form(3).await;
    let a = cluster.leader().await;
    let (b, c) = match a {
        1 => (2, 3),
        2 => (1, 3),
        _ => (1, 2),
    };
    let api = cluster.api(a);
    let session = open_session(&api, TTL).await;
    acquire(&api, &session, "job", false, 1).await.unwrap();
    let term_before = cluster.raft(a).metrics().borrow().current_term;

    // Just before the lease is half gone, every node is cut off from every
    // other. Writes on the leader wait for a quorum: they take every batch
    // the proposer may have in flight, then queue; the checkpoint its timer
    // decides at half the TTL queues behind them.
    tokio::time::sleep(TTL / 2 - Duration::from_millis(200)).await;
    cluster.net.cut_all(&[a, b, c]);
    let mut stuck = Vec::new();
    while metric(&api, "deadbolt_proposer_queued_commands").await < 1.0 {
        assert!(stuck.len() < 16, "writes without a quorum never queued");
        stuck.push(tokio::spawn({
            let api = api.clone();
            async move { open_session(&api, TTL).await }
        }));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        metric(&api, "deadbolt_proposer_queued_commands").await >= 2.0,
        "the checkpoint did not queue behind the stuck writes"
    );

    // Joined with one follower again, the old leader steps down before the
    // follower's higher term and wins the next election: the stuck writes
    // commit, and the checkpoint goes out in the new term.
    cluster.net.heal_link(a, b);
    for stuck in stuck {
        stuck.await.unwrap();
    }
    assert_eq!(cluster.leader().await, a);
    let term_after = cluster.raft(a).metrics().borrow().current_term;
    assert!(term_after > term_before, "{a} leads again in a later term");

    // The new term's leader restarted the lease; a keepalive is acknowledged
    // directly. Then that leader dies, and another takes over.
    cluster.net.heal();
    keep_alive(&api, &session).await.expect("renewed");
    let acknowledged = Instant::now();
    cluster.crash(a).await;
    let next = cluster.leader().await;
    let api = cluster.api(next);

    tokio::time::sleep_until(acknowledged + TTL - Duration::from_millis(500)).await;
    assert_eq!(
        lock_state(&api, "job").await.map(|state| state.holder_session_id),
        Some(session.id),
        "the session was gone {:?} after its acknowledged keepalive, before its {TTL:?} TTL ran out",
        acknowledged.elapsed()
    );
}

/// Seed 224: openraft 0.9 purges the log that a snapshot from the leader
/// covers as soon as it hands the snapshot to the state machine, before
/// the snapshot is written. A follower whose write of that snapshot failed
/// stopped (right), with its purge marker durable and its snapshot not:
/// every later start refused its directory as damaged ("the log was
/// compacted up to index N but the snapshot only reaches ..."), and it had
/// to be rebuilt from its peers. The purge must wait for the snapshot.
#[tokio::test(start_paused = true)]
async fn seed_224_a_follower_whose_snapshot_install_failed_starts_again() {
    let mut cluster = Cluster::form(3).await;
    let leader = cluster.leader().await;
    let follower = if leader == 1 { 2 } else { 1 };
    let other = 6 - leader - follower;
    // The follower falls behind a snapshot and a purged log.
    cluster.net.cut_all(&[follower, leader]);
    cluster.net.cut_all(&[follower, other]);
    let api = cluster.api(leader);
    let session = open_session(&api, Duration::from_secs(60)).await;
    for round in 0..5 {
        let token = acquire(&api, &session, "job", false, round).await.unwrap();
        release(&api, &session, "job", token).await;
    }
    let raft = cluster.raft(leader);
    raft.trigger().snapshot().await.unwrap();
    let applied = raft.metrics().borrow().last_applied.unwrap();
    raft.wait(Some(Duration::from_secs(5)))
        .snapshot(applied, "the leader's snapshot")
        .await
        .unwrap();
    raft.trigger().purge_log(applied.index).await.unwrap();
    raft.wait(Some(Duration::from_secs(5)))
        .purged(Some(applied), "the leader's log purged")
        .await
        .unwrap();

    // Its write of the snapshot the leader sends it fails.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(224);
    cluster.disks(follower).snapshots.fail_next_sync(&mut rng);
    cluster.net.heal();
    let stopped = cluster.raft(follower);
    let give_up = Instant::now() + Duration::from_secs(10);
    while stopped.metrics().borrow().running_state.is_ok() {
        assert!(
            Instant::now() < give_up,
            "the follower went on after a failed write"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Started again, it catches up (the harness's start fails on a refused
    // directory).
    cluster.restart(follower).await;
    let raft = cluster.raft(follower);
    raft.wait(Some(Duration::from_secs(10)))
        .applied_index_at_least(Some(applied.index), "caught up after the restart")
        .await
        .unwrap();
}
