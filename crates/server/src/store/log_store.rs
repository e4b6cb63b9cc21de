//! [`LogStore`]: openraft's log storage on redb.
//!
//! `append` commits one redb transaction (fsync) and only then tells openraft
//! the entries are durable, so nothing is acknowledged before it is on disk.
//!
//! Purging is split in two: `purge` durably moves the purge marker (cheap),
//! and a background [`Compactor`] thread deletes the entries below it a few
//! hundred at a time. Deleting ten thousand entries in one transaction would
//! stall every append behind it for over 100 ms.
//!
//! Every append and vote is also recorded in the [`WitnessFile`] after the
//! database commit and before openraft hears of it, so a database that
//! later goes back behind what was acknowledged is refused at start (see
//! `witness.rs`).
//!
//! Under the deterministic simulation ([`StorageIo::Inline`]) the same work
//! happens on the calling task instead: another thread would make the order
//! of events depend on the host's scheduler.

use super::witness::WitnessFile;
use super::{decode, encode, read_meta, write_meta, At, OrStorageError, LOG, PURGED_KEY, VOTE_KEY};
use crate::raft_types::{NodeId, StorageError, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    Entry, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, StorageIOError, Vote,
};
use redb::{Database, ReadableTable};
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the log's disk work runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageIo {
    /// Appends on tokio's blocking pool, compaction on its own thread: a
    /// real node, whose network must not wait on its disk.
    Threads,
    /// Everything on the calling task, in order: the deterministic
    /// simulation, whose disk is memory.
    Inline,
}

impl StorageIo {
    /// Runs `work` (disk work that may take a while: an fsync, a snapshot
    /// of the whole table) where this says: on the blocking pool, so that
    /// no tokio worker stalls on it, or right here. A panic in it becomes
    /// the storage error `on_panic` makes of it.
    pub(super) async fn run<T: Send + 'static>(
        self,
        work: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
        on_panic: impl FnOnce(&tokio::task::JoinError) -> StorageError,
    ) -> Result<T, StorageError> {
        match self {
            StorageIo::Threads => tokio::task::spawn_blocking(work)
                .await
                .unwrap_or_else(|panic| Err(on_panic(&panic))),
            StorageIo::Inline => work(),
        }
    }
}

#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    witness: Arc<Mutex<WitnessFile>>,
    io: StorageIo,
    compactor: Compactor,
    /// How long each append took to be durable (the metrics').
    append_seconds: prometheus_client::metrics::histogram::Histogram,
}

impl LogStore {
    pub fn new(
        db: Arc<Database>,
        witness: WitnessFile,
        io: StorageIo,
        append_seconds: prometheus_client::metrics::histogram::Histogram,
    ) -> Result<Self, StorageError> {
        let store = LogStore {
            append_seconds,
            compactor: Compactor::start(db.clone(), io),
            witness: Arc::new(Mutex::new(witness)),
            io,
            db,
        };
        // Finish deletions a crash interrupted.
        if let Some(purged) = read_meta::<LogId<NodeId>>(&store.db, PURGED_KEY, ErrorSubject::Logs)?
        {
            store.compactor.delete_up_to(purged.index);
        }
        Ok(store)
    }
}

/// Appends entries in one redb transaction, committed with
/// `Durability::Immediate`: fsync'd when this returns `Ok`.
fn write_entries(db: &Database, entries: &[Entry<TypeConfig>]) -> Result<(), StorageError> {
    let at = At(ErrorSubject::Logs, ErrorVerb::Write);
    let txn = db.begin_write().at(&at)?;
    {
        let mut table = txn.open_table(LOG).at(&at)?;
        for entry in entries {
            let bytes = encode(entry, &at)?;
            table.insert(entry.log_id.index, bytes.as_slice()).at(&at)?;
        }
    }
    txn.commit().at(&at)
}

/// Appends entries, then records the log's new end in the witness: both
/// durable when this returns `Ok`, in that order, so the database is never
/// behind its witness.
fn append_witnessed(
    db: &Database,
    witness: &Mutex<WitnessFile>,
    entries: &[Entry<TypeConfig>],
) -> Result<(), StorageError> {
    write_entries(db, entries)?;
    let Some(last) = entries.last() else {
        return Ok(());
    };
    let mut witness = witness.lock().expect("witness lock poisoned");
    // Entries appended again below the end (openraft may resend ones the
    // log already holds) leave the end where it was.
    let end = witness.current().last_log.max(Some(last.log_id));
    witness
        .record_last_log(end)
        .at(&At(ErrorSubject::Logs, ErrorVerb::Write))
}

/// The id of the log's last entry below `index`, or the purge marker if
/// none is left: where the log ends after a truncation at `index`.
fn last_log_id_below(db: &Database, index: u64) -> Result<Option<LogId<NodeId>>, StorageError> {
    let at = At(ErrorSubject::Logs, ErrorVerb::Read);
    let purged: Option<LogId<NodeId>> = read_meta(db, PURGED_KEY, ErrorSubject::Logs)?;
    let txn = db.begin_read().at(&at)?;
    let table = txn.open_table(LOG).at(&at)?;
    let last = match table.range(..index).at(&at)?.next_back() {
        Some(item) => Some(decode::<Entry<TypeConfig>>(item.at(&at)?.1.value(), &at)?.log_id),
        None => None,
    };
    Ok(last.max(purged))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let at = At(ErrorSubject::Logs, ErrorVerb::Read);
        let txn = self.db.begin_read().at(&at)?;
        let table = txn.open_table(LOG).at(&at)?;
        let mut entries = Vec::new();
        for item in table.range(range).at(&at)? {
            let (_, bytes) = item.at(&at)?;
            entries.push(decode(bytes.value(), &at)?);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let at = At(ErrorSubject::Logs, ErrorVerb::Read);
        let last_purged_log_id: Option<LogId<NodeId>> =
            read_meta(&self.db, PURGED_KEY, ErrorSubject::Logs)?;
        let txn = self.db.begin_read().at(&at)?;
        let table = txn.open_table(LOG).at(&at)?;
        let last = match table.last().at(&at)? {
            Some((_, bytes)) => {
                let entry: Entry<TypeConfig> = decode(bytes.value(), &at)?;
                Some(entry.log_id)
            }
            None => None,
        };
        // Entries at or below the purge marker may still await deletion by
        // the compactor; they never count as the end of the log.
        let last_log_id = match (last, last_purged_log_id) {
            (Some(last), Some(purged)) if last.index <= purged.index => Some(purged),
            (last, purged) => last.or(purged),
        };
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        write_meta(&self.db, VOTE_KEY, vote, ErrorSubject::Vote)?;
        self.witness
            .lock()
            .expect("witness lock poisoned")
            .record_vote(*vote)
            .at(&At(ErrorSubject::Vote, ErrorVerb::Write))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        read_meta(&self.db, VOTE_KEY, ErrorSubject::Vote)
    }

    /// Writes on a blocking thread: the commit waits for the disk, and a
    /// tokio worker stalled on fsync could not serve the network meanwhile.
    /// Returns once the entries are written and readable, as the storage
    /// contract requires.
    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let started = std::time::Instant::now();
        let (db, witness) = (self.db.clone(), self.witness.clone());
        let written = self
            .io
            .run(
                move || append_witnessed(&db, &witness, &entries),
                |panic| StorageIOError::write_logs(panic).into(),
            )
            .await;
        self.append_seconds.observe(started.elapsed().as_secs_f64());
        // Only after the commit (fsync) returned may openraft count these
        // entries as persisted.
        match &written {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(err) => callback.log_io_completed(Err(std::io::Error::other(err.to_string()))),
        }
        written
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        let at = At(ErrorSubject::Logs, ErrorVerb::Delete);
        // The witness first: a crash between the two leaves the database
        // past its witness, which is allowed; the other order would not be.
        let end = last_log_id_below(&self.db, log_id.index)?;
        self.witness
            .lock()
            .expect("witness lock poisoned")
            .record_last_log(end)
            .at(&at)?;
        let txn = self.db.begin_write().at(&at)?;
        txn.open_table(LOG)
            .at(&at)?
            .retain_in(log_id.index.., |_, _| false)
            .at(&at)?;
        txn.commit().at(&at)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        // Durable before returning: from now on `get_log_state` reports the
        // entries up to here as gone, whether or not they are deleted yet.
        write_meta(&self.db, PURGED_KEY, &log_id, ErrorSubject::Logs)?;
        self.compactor.delete_up_to(log_id.index);
        Ok(())
    }
}

/// Deletes purged log entries in small transactions on its own thread (or
/// at once, inline). The thread ends when the last `LogStore` clone is
/// dropped.
#[derive(Clone)]
enum Compactor {
    Thread {
        targets: std::sync::mpsc::Sender<u64>,
    },
    Inline {
        db: Arc<Database>,
    },
}

/// Entries deleted per transaction (about a millisecond of work), and the
/// pause after each: redb's write lock is not fair, so without the pause an
/// append could wait for the whole compaction (measured: 80 ms for 9k
/// entries) instead of for one chunk.
const DELETE_CHUNK: u64 = 128;
const DELETE_PAUSE: Duration = Duration::from_millis(2);

impl Compactor {
    fn start(db: Arc<Database>, io: StorageIo) -> Self {
        if io == StorageIo::Inline {
            return Compactor::Inline { db };
        }
        let (targets, incoming) = std::sync::mpsc::channel::<u64>();
        std::thread::Builder::new()
            .name("log-compactor".into())
            .spawn(move || {
                while let Ok(mut target) = incoming.recv() {
                    // Only the newest target matters.
                    target = incoming.try_iter().fold(target, u64::max);
                    delete_entries_reporting(&db, target, DELETE_PAUSE);
                }
            })
            .expect("cannot start the log compactor thread");
        Compactor::Thread { targets }
    }

    fn delete_up_to(&self, index: u64) {
        match self {
            // The thread only stops when every sender is gone, so this succeeds.
            Compactor::Thread { targets } => {
                let _ = targets.send(index);
            }
            Compactor::Inline { db } => delete_entries_reporting(db, index, Duration::ZERO),
        }
    }
}

fn delete_entries_reporting(db: &Database, target: u64, pause: Duration) {
    if let Err(err) = delete_entries_up_to(db, target, pause) {
        // Leftover entries below the marker are harmless; the next purge
        // (or restart) tries again.
        tracing::warn!(%err, "compacting the raft log failed");
    }
}

fn delete_entries_up_to(db: &Database, target: u64, pause: Duration) -> Result<(), redb::Error> {
    loop {
        let mut txn = db.begin_write()?;
        let first = {
            let table = txn.open_table(LOG)?;
            let first = table.first()?.map(|(index, _)| index.value());
            first
        };
        let Some(first) = first.filter(|&first| first <= target) else {
            txn.abort()?;
            return Ok(());
        };
        let end = first.saturating_add(DELETE_CHUNK - 1).min(target);
        txn.open_table(LOG)?.retain_in(first..=end, |_, _| false)?;
        // No fsync of its own: a deletion lost in a crash only leaves
        // entries below the purge marker, which are ignored and deleted again.
        txn.set_durability(redb::Durability::None);
        txn.commit()?;
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};
    use redb::ReadableTableMetadata;

    fn entry(index: u64) -> Entry<TypeConfig> {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        }
    }

    fn stored_indexes(db: &Database) -> (u64, u64) {
        let txn = db.begin_read().unwrap();
        let table = txn.open_table(LOG).unwrap();
        let first = table.first().unwrap().map_or(0, |(k, _)| k.value());
        (first, table.len().unwrap())
    }

    #[tokio::test]
    async fn purge_moves_the_marker_at_once_and_deletes_in_the_background() {
        let dir = tempfile::tempdir().unwrap();
        let opened = super::super::open_data_dir(dir.path(), 1).unwrap();
        let db = Arc::new(opened.db);
        let mut store = LogStore::new(
            db.clone(),
            opened.witness,
            StorageIo::Threads,
            prometheus_client::metrics::histogram::Histogram::new([]),
        )
        .unwrap();
        let entries: Vec<_> = (1..=1000).map(entry).collect();
        write_entries(&db, &entries).unwrap();

        store.purge(entry(900).log_id).await.unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id.map(|id| id.index), Some(900));
        assert_eq!(state.last_log_id.map(|id| id.index), Some(1000));

        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while stored_indexes(&db) != (901, 100) {
            assert!(
                std::time::Instant::now() < deadline,
                "compactor stuck at {:?}",
                stored_indexes(&db)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let kept = store.try_get_log_entries(901..=1000).await.unwrap();
        assert_eq!(kept.len(), 100);

        // Purging everything leaves the purge marker as the end of the log.
        store.purge(entry(1000).log_id).await.unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id.map(|id| id.index), Some(1000));
    }
}
