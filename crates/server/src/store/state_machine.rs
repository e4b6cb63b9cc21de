//! [`StateMachineStore`]: openraft's state machine, a [`LockTable`] in memory
//! with its snapshots persisted in a redb database of their own.
//!
//! Applying an entry never touches the disk: durability comes from the log.
//! A snapshot is written (fsync'd) before openraft may purge the log entries
//! it covers, so the pair (snapshot, remaining log) always rebuilds the table.
//!
//! Building a snapshot must not stall requests, even of a full table (a
//! million locks: 100 MB, a second to encode and write). So the state lock
//! is held only to clone the table, which is O(1) (its maps are persistent:
//! see `LockTable`), and the encoding and the write happen on the blocking
//! pool, in a database the log's appends never wait for.

use super::durable_snapshot::{SnapshotOnDisk, SnapshotWritten};
use super::table_image::{self, ImageError};
use super::{snapshot_chunks, At, OrStorageError, StorageIo};
use crate::raft_types::{Batch, BatchOutcome, NodeId, StorageError, TypeConfig};
use crate::watches::WatchedEntry;
use deadbolt_core::{Command, Event, FeatureLevel, LockTable, LockTableV9};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId, OptionalSend,
    RaftSnapshotBuilder, SnapshotMeta, StoredMembership,
};
use redb::Database;
use serde::{Deserialize, Serialize};
use std::io::Cursor;
use std::sync::{Arc, RwLock};

/// Told about every event the table produces, right after the entries that
/// produced them are applied. The server wakes blocked acquirers, starts
/// or stops lease tracking, and counts what happened (metrics) from here.
pub trait EventSink: Send + Sync + 'static {
    /// `events` of the entries applied up to `applied` (a log index), and
    /// what watchers see of them, entry by entry.
    fn on_events(&self, events: Vec<Event>, watched: Vec<WatchedEntry>, applied: u64);
    /// What the entries applied produced, for the metrics: called before
    /// `on_events` with the same entries' outcomes and events.
    fn on_applied(&self, outcomes: &[BatchOutcome], events: &[Event]);
    /// A snapshot of `bytes` was built and written in `took`.
    fn on_snapshot_built(&self, bytes: usize, took: std::time::Duration);
    /// The table was replaced by a snapshot (of log index `applied`): no
    /// events lead from the old state to the new one, so observers must
    /// rebuild from the table.
    fn on_reset(&self, table: &LockTable, applied: u64);
}

/// The lock table and how far into the log it reflects.
#[derive(Debug, Default)]
pub struct Applied {
    pub last_applied: Option<LogId<NodeId>>,
    pub membership: StoredMembership<NodeId, BasicNode>,
    pub table: LockTable,
}

/// Read access for the API (status, listings) without going through Raft.
pub type SharedTable = Arc<RwLock<Applied>>;

#[derive(Serialize, Deserialize)]
pub(super) struct StoredSnapshot {
    pub meta: SnapshotMeta<NodeId, BasicNode>,
    pub data: Vec<u8>,
}

#[derive(Clone)]
pub struct StateMachineStore {
    state: SharedTable,
    /// The snapshot database (not the log's).
    snapshots: Arc<Database>,
    io: StorageIo,
    sink: Arc<dyn EventSink>,
    /// The highest cluster version this node applies (see
    /// [`AboveSupported`]).
    feature_level: FeatureLevel,
    /// How far the snapshot on disk reaches, for the log's purges.
    written: SnapshotWritten,
}

impl StateMachineStore {
    /// Loads the latest snapshot from `snapshots`, if any. Log entries after
    /// it are re-applied by openraft when the `Raft` starts.
    pub fn open(
        snapshots: Database,
        io: StorageIo,
        sink: Arc<dyn EventSink>,
        feature_level: FeatureLevel,
    ) -> Result<Self, StorageError> {
        let mut store = StateMachineStore {
            state: SharedTable::default(),
            snapshots: Arc::new(snapshots),
            io,
            sink,
            feature_level,
            written: SnapshotWritten::new(None),
        };
        if let Some(stored) = store.read_snapshot()? {
            store.written = SnapshotWritten::new(stored.meta.last_log_id.map(|id| id.index));
            let at = reading(&stored);
            let table = decode_table(&stored).at(&at)?;
            check_supported(&table, feature_level).at(&at)?;
            let mut state = store.state.write().expect("state lock poisoned");
            state.last_applied = stored.meta.last_log_id;
            state.membership = stored.meta.last_membership;
            state.table = table;
            store
                .sink
                .on_reset(&state.table, index_of(state.last_applied));
        }
        Ok(store)
    }

    pub fn shared(&self) -> SharedTable {
        self.state.clone()
    }

    /// How far the snapshot on disk reaches: the log store purges no
    /// further (see `durable_snapshot.rs`).
    pub fn snapshot_on_disk(&self) -> SnapshotOnDisk {
        self.written.on_disk()
    }

    fn read_snapshot(&self) -> Result<Option<StoredSnapshot>, StorageError> {
        let at = At(ErrorSubject::Snapshot(None), ErrorVerb::Read);
        let txn = self.snapshots.begin_read().at(&at)?;
        snapshot_chunks::read(&txn)
            .at(&at)?
            .map(|sealed| super::decode(&sealed, &at))
            .transpose()
    }

    /// Writes the snapshot `encode` makes, with `meta`, off the async
    /// workers (see [`StorageIo::run`]): durable when this returns `Ok`.
    async fn persist(
        &self,
        meta: SnapshotMeta<NodeId, BasicNode>,
        encode: impl FnOnce() -> Result<Vec<u8>, StorageError> + Send + 'static,
    ) -> Result<StoredSnapshot, StorageError> {
        let snapshots = self.snapshots.clone();
        let subject = ErrorSubject::Snapshot(Some(meta.signature()));
        let on_panic = subject.clone();
        let persisted = self
            .io
            .run(
                move || {
                    let stored = StoredSnapshot {
                        meta,
                        data: encode()?,
                    };
                    let at = At(subject, ErrorVerb::Write);
                    snapshot_chunks::write(&snapshots, &super::encode(&stored, &at)?).at(&at)?;
                    Ok(stored)
                },
                |panic| {
                    openraft::StorageIOError::new(
                        on_panic,
                        ErrorVerb::Write,
                        openraft::AnyError::new(panic),
                    )
                    .into()
                },
            )
            .await;
        match &persisted {
            Ok(stored) => self
                .written
                .reached(stored.meta.last_log_id.map(|id| id.index)),
            Err(err) => self.written.failed(err),
        }
        persisted
    }
}

pub(super) fn decode_table(stored: &StoredSnapshot) -> Result<LockTable, ImageError> {
    table_image::decode(&stored.data).map(checked)
}

/// A format-9 snapshot's table: encoded before the table held its limits
/// ([`LockTableV9`]); it gets the default limits, the ones it ran with.
pub(super) fn decode_table_v9(stored: &StoredSnapshot) -> Result<LockTable, ImageError> {
    let table = bincode::deserialize::<LockTableV9>(&stored.data)?;
    Ok(checked(table.into()))
}

/// A format-9 snapshot record (sealed, as `META` holds it) in format 10's
/// encoding: the same snapshot, its table with the default limits.
pub(super) fn upgrade_format_9(sealed: &[u8]) -> Result<Vec<u8>, StorageError> {
    let at = At(ErrorSubject::Snapshot(None), ErrorVerb::Read);
    let old: StoredSnapshot = super::decode(sealed, &at)?;
    let table = decode_table_v9(&old).at(&reading(&old))?;
    let at = At(
        ErrorSubject::Snapshot(Some(old.meta.signature())),
        ErrorVerb::Write,
    );
    let upgraded = StoredSnapshot {
        data: table_image::encode(&table).at(&at)?,
        meta: old.meta,
    };
    super::encode(&upgraded, &at)
}

/// A decoded table, once its invariants are checked. A snapshot is loaded
/// rarely; checking it whole is cheap insurance against installing a table
/// that breaks the lock invariants.
fn checked(table: LockTable) -> LockTable {
    table.check_invariants();
    table
}

/// Where a snapshot's table was read, for openraft's error reports.
fn reading(stored: &StoredSnapshot) -> At {
    At(
        ErrorSubject::Snapshot(Some(stored.meta.signature())),
        ErrorVerb::Read,
    )
}

/// State this node must not apply: a log entry or snapshot at a cluster
/// version above the feature level the node supports, which a newer
/// release's leader wrote (or, on a node started with a lower
/// `--max-feature-level`, the level it stands in for). Applying the rest
/// and skipping it would leave this replica's state different from the
/// others'; the node stops instead, and its log says what to do.
#[derive(Debug, thiserror::Error)]
#[error(
    "{what} is at cluster version {level}, above the feature level {supports} this node supports \
     (release {release}, or lower with --max-feature-level): a newer release wrote it. Run a \
     release that supports it here, without a lower --max-feature-level (docs/upgrading.md)",
    release = crate::RELEASE
)]
pub struct AboveSupported {
    what: String,
    level: FeatureLevel,
    supports: FeatureLevel,
}

/// Refuses a table (from a snapshot) above what this node supports.
fn check_supported(table: &LockTable, supports: FeatureLevel) -> Result<(), AboveSupported> {
    let level = table.cluster_version();
    if level > supports {
        return Err(AboveSupported {
            what: "the snapshot".to_owned(),
            level,
            supports,
        });
    }
    Ok(())
}

fn index_of(log_id: Option<LogId<NodeId>>) -> u64 {
    log_id.map_or(0, |id| id.index)
}

/// Applies one committed log entry to the table, as every replica does
/// (and as `deadbolt data check` replays the log), collecting the events
/// and, if `watched` is given, what watchers see of them.
pub(super) fn apply_entry(
    state: &mut Applied,
    entry: Entry<TypeConfig>,
    events: &mut Vec<Event>,
    watched: Option<&mut Vec<WatchedEntry>>,
    supports: FeatureLevel,
) -> Result<BatchOutcome, AboveSupported> {
    debug_assert!(state.last_applied < Some(entry.log_id));
    if let EntryPayload::Normal(batch) = &entry.payload {
        let above = batch.commands.iter().find_map(|command| match command {
            Command::SetClusterVersion { level } if *level > supports => Some(*level),
            _ => None,
        });
        if let Some(level) = above {
            return Err(AboveSupported {
                what: format!("log entry {}", entry.log_id.index),
                level,
                supports,
            });
        }
    }
    state.last_applied = Some(entry.log_id);
    let outcomes = match entry.payload {
        EntryPayload::Blank => Vec::new(),
        EntryPayload::Normal(Batch { commands, at_ms }) => {
            state.table.raise_token_floor(at_ms);
            let term = entry.log_id.leader_id.term;
            let mut watch = Vec::new();
            let outcomes = commands
                .iter()
                .map(|command| {
                    let into = watched.is_some().then_some(&mut watch);
                    let table = &mut state.table;
                    table.apply_watched_into(command, at_ms, term, into, events)
                })
                .collect();
            if let Some(watched) = watched.filter(|_| !watch.is_empty()) {
                watched.push(WatchedEntry {
                    index: entry.log_id.index,
                    events: watch,
                });
            }
            outcomes
        }
        EntryPayload::Membership(membership) => {
            state.membership = StoredMembership::new(Some(entry.log_id), membership);
            Vec::new()
        }
    };
    Ok(BatchOutcome(outcomes))
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let started = std::time::Instant::now();
        let (table, meta) = {
            let state = self.state.read().expect("state lock poisoned");
            let snapshot_id = match state.last_applied {
                Some(id) => format!("{}-{}", id.leader_id, id.index),
                None => "empty".to_owned(),
            };
            let meta = SnapshotMeta {
                last_log_id: state.last_applied,
                last_membership: state.membership.clone(),
                snapshot_id,
            };
            // O(1): the clone shares the maps until the next apply changes them.
            (state.table.clone(), meta)
        };
        let subject = ErrorSubject::Snapshot(Some(meta.signature()));
        let encode = move || table_image::encode(&table).at(&At(subject, ErrorVerb::Write));
        let stored = self.persist(meta, encode).await?;
        self.sink
            .on_snapshot_built(stored.data.len(), started.elapsed());
        Ok(Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError> {
        let state = self.state.read().expect("state lock poisoned");
        Ok((state.last_applied, state.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<BatchOutcome>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut events = Vec::new();
        let mut watched = Vec::new();
        let (replies, applied): (Vec<BatchOutcome>, u64) = {
            let mut state = self.state.write().expect("state lock poisoned");
            let replies = entries
                .into_iter()
                .map(|entry| {
                    let at = At(ErrorSubject::Apply(entry.log_id), ErrorVerb::Read);
                    let watched = Some(&mut watched);
                    apply_entry(&mut state, entry, &mut events, watched, self.feature_level).at(&at)
                })
                .collect::<Result<_, _>>()?;
            (replies, index_of(state.last_applied))
        };
        self.sink.on_applied(&replies, &events);
        self.sink.on_events(events, watched, applied);
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: snapshot.into_inner(),
        };
        let at = reading(&stored);
        let table = decode_table(&stored).at(&at)?;
        check_supported(&table, self.feature_level).at(&at)?;
        // Tokens are a function of the log prefix, so a snapshot may only
        // move the counter forward. One that would move it back is refused
        // before anything is written; openraft then stops this node, which
        // is the right answer to a snapshot that cannot be.
        let current = self
            .state
            .read()
            .expect("state lock poisoned")
            .table
            .next_token();
        if table.next_token() < current {
            let reason = format!(
                "snapshot {} would move the token counter back from {} to {}",
                meta.snapshot_id,
                current,
                table.next_token()
            );
            return Err(openraft::StorageIOError::write_snapshot(
                Some(meta.signature()),
                openraft::AnyError::error(reason),
            )
            .into());
        }
        self.persist(stored.meta, move || Ok(stored.data)).await?;
        let mut state = self.state.write().expect("state lock poisoned");
        state.last_applied = meta.last_log_id;
        state.membership = meta.last_membership.clone();
        state.table = table;
        self.sink
            .on_reset(&state.table, index_of(state.last_applied));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(self.read_snapshot()?.map(|stored| Snapshot {
            meta: stored.meta,
            snapshot: Box::new(Cursor::new(stored.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::data_dir::{open_data_dir, SNAPSHOTS_FILE};

    /// Observes nothing: these tests look at the store itself.
    struct Unobserved;

    impl EventSink for Unobserved {
        fn on_events(&self, _: Vec<Event>, _: Vec<WatchedEntry>, _: u64) {}
        fn on_applied(&self, _: &[BatchOutcome], _: &[Event]) {}
        fn on_snapshot_built(&self, _: usize, _: std::time::Duration) {}
        fn on_reset(&self, _: &LockTable, _: u64) {}
    }

    /// A full table's snapshot (112.5 MiB), replaced every 10,000 entries,
    /// grew its file to 1,028 MiB before it settled at 770 MiB: it was one
    /// value, in a page rounded up to a power of two, and a write could not
    /// reuse the pages the write before it freed. Snapshots of 6 MiB show
    /// the same in seconds: 68.5 MiB, then 50.5 MiB, before the fix; 24.5
    /// MiB, then 18.5 MiB, after it.
    #[tokio::test]
    async fn the_snapshot_file_does_not_grow_with_each_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let data = open_data_dir(dir.path(), 1).unwrap();
        let mut store = StateMachineStore::open(
            data.snapshots,
            StorageIo::Inline,
            Arc::new(Unobserved),
            FeatureLevel::NEWEST,
        )
        .unwrap();
        // Each a little larger than the last, as a filling table's.
        let len = |n: u8| (6 << 20) + usize::from(n) * (16 << 10);
        let mut sizes = Vec::new();
        for n in 0..8 {
            let meta = SnapshotMeta {
                snapshot_id: n.to_string(),
                ..SnapshotMeta::default()
            };
            store
                .persist(meta, move || Ok(vec![n; len(n)]))
                .await
                .unwrap();
            sizes.push(
                std::fs::metadata(dir.path().join(SNAPSHOTS_FILE))
                    .unwrap()
                    .len(),
            );
            // The bound `snapshot_chunks.rs` states.
            let bound = 4 * len(n) as u64 + (4 << 20);
            assert!(
                sizes.iter().all(|&size| size <= bound),
                "the file's sizes, snapshot after snapshot, up to {} bytes: {sizes:?}",
                len(n)
            );
        }
        let current = store.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(current.meta.snapshot_id, "7");
        assert_eq!(*current.snapshot.get_ref(), vec![7; len(7)]);
    }
}
