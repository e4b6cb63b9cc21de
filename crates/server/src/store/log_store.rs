//! [`LogStore`]: openraft's log storage on [`LogFile`] segments.
//!
//! `append` writes and fdatasyncs the entries' record and only then tells
//! openraft the entries are durable, so nothing is acknowledged before it
//! is on disk.
//!
//! Every append and vote is also recorded in the [`WitnessFile`] after the
//! write and before openraft hears of it, so a log that later goes back
//! behind what was acknowledged (a damaged record, a segment lost, an older
//! copy put back) is refused at start (see `witness.rs`).
//!
//! The vote and the purge marker stay in the redb database: written rarely,
//! each in a transaction of its own.
//!
//! Under the deterministic simulation ([`StorageIo::Inline`]) the same work
//! happens on the calling task instead: another thread would make the order
//! of events depend on the host's scheduler.

use super::log_file::{LogFile, LogIndex};
use super::witness::WitnessFile;
use super::{read_meta, write_meta, At, OrStorageError, PURGED_KEY, VOTE_KEY};
use crate::raft_types::{NodeId, StorageError, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{
    Entry, ErrorSubject, ErrorVerb, LogId, OptionalSend, RaftLogReader, StorageIOError, Vote,
};
use redb::Database;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, RwLock};

/// Where the log's disk work runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageIo {
    /// Appends on tokio's blocking pool: a real node, whose network must
    /// not wait on its disk.
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
    /// The writer: appends, truncations, purges (openraft makes one at a
    /// time).
    log: Arc<Mutex<LogFile>>,
    /// What readers read, without waiting for the writer's fsync.
    index: Arc<RwLock<LogIndex>>,
    witness: Arc<Mutex<WitnessFile>>,
    io: StorageIo,
    /// How long each append took to be durable (the metrics').
    append_seconds: prometheus_client::metrics::histogram::Histogram,
}

impl LogStore {
    pub fn new(
        db: Arc<Database>,
        log: LogFile,
        witness: WitnessFile,
        io: StorageIo,
        append_seconds: prometheus_client::metrics::histogram::Histogram,
    ) -> Self {
        LogStore {
            append_seconds,
            index: log.index(),
            log: Arc::new(Mutex::new(log)),
            witness: Arc::new(Mutex::new(witness)),
            io,
            db,
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, LogFile> {
        self.log.lock().expect("log lock poisoned")
    }
}

/// Appends entries, then records the log's new end in the witness: both
/// durable when this returns `Ok`, in that order, so the log is never
/// behind its witness.
fn append_witnessed(
    log: &Mutex<LogFile>,
    witness: &Mutex<WitnessFile>,
    entries: &[Entry<TypeConfig>],
) -> Result<(), StorageError> {
    let at = At(ErrorSubject::Logs, ErrorVerb::Write);
    let mut log = log.lock().expect("log lock poisoned");
    log.append(entries).at(&at)?;
    witness
        .lock()
        .expect("witness lock poisoned")
        .record_last_log(log.last_log_id())
        .at(&at)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        self.index
            .read()
            .expect("log index lock poisoned")
            .read(range)
            .at(&At(ErrorSubject::Logs, ErrorVerb::Read))
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id: Option<LogId<NodeId>> =
            read_meta(&self.db, PURGED_KEY, ErrorSubject::Logs)?;
        Ok(LogState {
            last_purged_log_id,
            last_log_id: self.log().last_log_id(),
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

    /// Writes on a blocking thread: the write waits for the disk, and a
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
        let (log, witness) = (self.log.clone(), self.witness.clone());
        let written = self
            .io
            .run(
                move || append_witnessed(&log, &witness, &entries),
                |panic| StorageIOError::write_logs(panic).into(),
            )
            .await;
        self.append_seconds.observe(started.elapsed().as_secs_f64());
        // Only after the fsync returned may openraft count these entries as
        // persisted.
        match &written {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(err) => callback.log_io_completed(Err(std::io::Error::other(err.to_string()))),
        }
        written
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        let at = At(ErrorSubject::Logs, ErrorVerb::Delete);
        let mut log = self.log();
        // The witness first: a crash between the two leaves the log past
        // its witness, which is allowed; the other order would not be.
        let end = match log_id.index.checked_sub(1) {
            Some(before) => log.log_id_at_or_purged(before).at(&at)?,
            None => None,
        };
        self.witness
            .lock()
            .expect("witness lock poisoned")
            .record_last_log(end)
            .at(&at)?;
        log.truncate(log_id.index).at(&at)
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        // Durable before returning: from now on `get_log_state` reports the
        // entries up to here as gone, whether or not their segments are.
        write_meta(&self.db, PURGED_KEY, &log_id, ErrorSubject::Logs)?;
        self.log()
            .purge(log_id)
            .at(&At(ErrorSubject::Logs, ErrorVerb::Delete))
    }
}
