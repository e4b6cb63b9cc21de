//! openraft's own storage test suite (`openraft::testing::Suite`), run
//! against our [`LogStore`] and [`StateMachineStore`] on both disks they run
//! on: a data directory (a real node: log I/O on threads, a background
//! compactor) and the simulated disk (the simulation: everything inline).
//!
//! Why: our stores are hand-written on redb, and openraft's contract for
//! them (what `get_log_state` reports after a purge, that a truncation moves
//! the end of the log back, that an installed snapshot becomes the current
//! one, ...) is written down in that suite better than anywhere else. The
//! simulation exercises the stores only through the paths a cluster happens
//! to take; the suite walks every corner of the contract, seed-independent.
//!
//! The stores are built only through the constructors the server uses
//! (`open_data_dir` / `open_simulated_disk`, `LogStore::new`,
//! `StateMachineStore::open`), with the node's real observers, so a change
//! of how data is opened or snapshots are kept is tested here unchanged.
//!
//! The suite never reopens a store, so one test here adds what it leaves
//! out: everything the stores acknowledged survives a crash of the
//! simulated disk that keeps only synced writes.
//!
//! Also here: the store's half of the fix for simulation seed 100605 (the
//! state machine refuses a leader's timer command committed in a term other
//! than the one that decided it; the table's half is tested in
//! `crates/core/tests/regressions.rs`).

use super::durable_snapshot::SnapshotOnDisk;
use super::{
    open_data_dir, open_simulated_disk, LogStore, SimulatedDisks, StateMachineStore, StorageIo,
};
use crate::clock::Clock;
use crate::leases::Leases;
use crate::metrics::Metrics;
use crate::node::Observers;
use crate::raft_types::{Batch, StorageError, TypeConfig};
use crate::testing::sim_disk::SimDisk;
use crate::waits::Waits;
use deadbolt_core::{Command, LockError, Outcome, SecretHash};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
use openraft::{RaftLogReader, RaftSnapshotBuilder};
use rand::SeedableRng;
use std::sync::Arc;

/// A node's observers, as `open_node` wires them to the state machine.
fn observers(metrics: &Arc<Metrics>) -> Arc<Observers> {
    Arc::new(Observers {
        waits: Arc::new(Waits::default()),
        leases: Arc::new(Leases::new(Clock::host())),
        metrics: metrics.clone(),
        history: Default::default(),
    })
}

/// Opens a data directory as `deadbolt server` does, in a fresh temp dir.
struct OnDataDir;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for OnDataDir {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
        let dir = tempfile::tempdir().expect("a temp dir");
        let data = open_data_dir(dir.path(), 1).expect("a new data directory opens");
        let (log, state_machine) = stores(data, StorageIo::Threads)?;
        Ok((dir, log, state_machine))
    }
}

/// Opens a blank simulated disk as the simulation's nodes do.
struct OnSimulatedDisk;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, ()> for OnSimulatedDisk {
    async fn build(&self) -> Result<((), LogStore, StateMachineStore), StorageError> {
        let data = open_simulated_disk(&SimulatedDisks::<SimDisk>::default(), 1)
            .expect("a blank simulated disk opens");
        let (log, state_machine) = stores(data, StorageIo::Inline)?;
        Ok(((), log, state_machine))
    }
}

fn stores(
    data: super::OpenedData,
    io: StorageIo,
) -> Result<(LogStore, StateMachineStore), StorageError> {
    let metrics = Arc::new(Metrics::new(
        crate::version::build_versions(),
        data.space.gauge(),
    ));
    let state_machine = StateMachineStore::open(
        data.snapshots,
        io,
        observers(&metrics),
        deadbolt_core::FeatureLevel::NEWEST,
    )?;
    let log = LogStore::new(
        Arc::new(data.db),
        data.log,
        data.witness,
        io,
        metrics.log_append_seconds(),
        SnapshotOnDisk::covering_everything(),
        data.space,
    );
    Ok((log, state_machine))
}

#[test]
fn openraft_storage_suite_on_a_data_directory() {
    Suite::test_all(OnDataDir).expect("the storage suite passes");
}

#[test]
fn openraft_storage_suite_on_the_simulated_disk() {
    Suite::test_all(OnSimulatedDisk).expect("the storage suite passes");
}

/// What the suite never checks: that the stores' writes are on disk when
/// they return. The simulated disk is crashed keeping only what was synced,
/// and everything the stores acknowledged (log, vote, purge marker,
/// snapshot) must come back, through the same checks a restart makes.
#[tokio::test]
async fn what_the_stores_acknowledged_survives_a_crash_that_keeps_only_synced_writes() {
    type OnSim = Suite<TypeConfig, LogStore, StateMachineStore, OnSimulatedDisk, ()>;
    let disks = SimulatedDisks::<SimDisk>::default();
    let data = open_simulated_disk(&disks, 1).unwrap();
    let (mut log, mut state_machine) = stores(data, StorageIo::Inline).unwrap();
    OnSim::feed_10_logs_vote_self(&mut log).await.unwrap();
    let blanks = (1..=5).map(|index| Entry::<TypeConfig> {
        log_id: LogId::new(CommittedLeaderId::new(1, 0), index),
        payload: EntryPayload::Blank,
    });
    state_machine.apply(blanks).await.unwrap();
    let built = state_machine
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    // As openraft does: entries purged only once a snapshot covers them.
    log.purge(LogId::new(CommittedLeaderId::new(1, 0), 3))
        .await
        .unwrap();
    let log_state = log.get_log_state().await.unwrap();
    let vote = log.read_vote().await.unwrap();
    let entries = log.try_get_log_entries(4..=10).await.unwrap();

    // The crash comes while the database is open: closing it would sync.
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let crashed = disks.map(|disk| disk.after_crash(0.0, &mut rng));
    drop((log, state_machine));
    let data = open_simulated_disk(&crashed, 1).expect("the crashed disk opens");
    let (mut log, mut state_machine) = stores(data, StorageIo::Inline).unwrap();
    assert_eq!(log.get_log_state().await.unwrap(), log_state);
    assert_eq!(log.read_vote().await.unwrap(), vote);
    assert_eq!(log.try_get_log_entries(4..=10).await.unwrap(), entries);
    let snapshot = state_machine.get_current_snapshot().await.unwrap();
    assert_eq!(
        snapshot.map(|snapshot| snapshot.meta),
        Some(built.meta.clone())
    );
    assert_eq!(
        state_machine.applied_state().await.unwrap(),
        (built.meta.last_log_id, built.meta.last_membership)
    );
}

fn entry(term: u64, index: u64, commands: Vec<Command>) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Normal(Batch {
            commands: commands.into(),
            at_ms: 0,
        }),
    }
}

/// Seed 100605: a lease checkpoint decided by the leader of term 3 waited in
/// its proposer while leadership changed, and was committed in term 4, after
/// that term's leader had restarted the lease; the next leader then started
/// the session with 350 ms left, and it expired before its TTL. The state
/// machine must judge a timer command by the term of the entry that
/// committed it, not by the term the command says it was decided in.
#[tokio::test]
async fn seed_100605_a_checkpoint_committed_in_a_later_term_is_refused_by_the_store() {
    let (_, _log, mut state_machine) = OnSimulatedDisk.build().await.unwrap();
    let open = Command::OpenSession {
        ttl_ms: 10_000,
        secret: SecretHash([7; 32]),
        owner: None,
    };
    let opened = state_machine
        .apply([entry(3, 1, vec![open])])
        .await
        .unwrap();
    let session = match &opened[0].0[..] {
        [Ok(Outcome::SessionOpened { session, .. })] => *session,
        other => panic!("open: {other:?}"),
    };
    let lease_before: Vec<_> = table_sessions(&state_machine);

    let checkpoint = |term| Command::CheckpointLease {
        session,
        remaining_ms: 350,
        renewals: 0,
        term,
    };
    let applied = state_machine
        .apply([entry(4, 2, vec![checkpoint(3)])])
        .await
        .unwrap();
    assert_eq!(
        applied[0].0,
        vec![Err(LockError::Superseded {
            decided: 3,
            committed: 4
        })],
        "a checkpoint decided in term 3 and committed in term 4 must be refused"
    );
    assert_eq!(
        table_sessions(&state_machine),
        lease_before,
        "the refused checkpoint changed the lease a new leader would start from"
    );

    // Committed in the term that decided it, a checkpoint counts.
    let applied = state_machine
        .apply([entry(4, 3, vec![checkpoint(4)])])
        .await
        .unwrap();
    assert!(applied[0].0[0].is_ok(), "{applied:?}");
    assert_ne!(table_sessions(&state_machine), lease_before);
}

fn table_sessions(
    state_machine: &StateMachineStore,
) -> Vec<(deadbolt_core::SessionId, deadbolt_core::SessionLease)> {
    let shared = state_machine.shared();
    let applied = shared.read().expect("state lock poisoned");
    applied.table.sessions().collect()
}
