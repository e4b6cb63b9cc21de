//! [`LogStore`]: openraft's log storage on [`LogFile`] segments.
//!
//! `append` writes and fdatasyncs the entries' record and only then tells
//! openraft the entries are durable, so nothing is acknowledged before it
//! is on disk.
//!
//! The log's end is also recorded in the [`WitnessFile`], so that a log that
//! later goes back behind it (a segment lost, an older copy put back) is
//! refused at start (see `witness.rs`); votes too. A vote is recorded
//! before openraft hears of it, as before. The log's end is recorded a
//! moment *after* the append is acknowledged, by a thread of its own
//! ([`LazyWitness`]): a second fsync before every acknowledgment cost a
//! third of the throughput, and what it guarded against is covered by the
//! log's own mirrored records (`log_file.rs`): a record is lost only if
//! both its copies are, and the witness trails the log by one fsync at
//! most (none after a clean stop).
//!
//! The vote and the purge marker stay in the redb database: written rarely,
//! each in a transaction of its own.
//!
//! Under the deterministic simulation ([`StorageIo::Inline`]) the same work
//! happens on the calling task instead: another thread would make the order
//! of events depend on the host's scheduler.

use super::disk_space::{is_disk_full, DiskSpace, Waits};
use super::durable_snapshot::SnapshotOnDisk;
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
use std::sync::{Arc, Condvar, Mutex, RwLock};

/// Where the log's disk work runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StorageIo {
    /// Appends on tokio's blocking pool: a real node on several threads,
    /// whose network must not wait on its disk.
    Threads,
    /// Appends on the calling task, snapshots and the witness on threads of
    /// their own: a real node on one thread (`deadbolt server --threads
    /// 1`), which waits for its log's fsync as Redis waits for its AOF's.
    /// Handing each append to another thread and back cost that one thread
    /// more than the wait (bench/results/2026-12-05.md).
    InlineAppends,
    /// Everything on the calling task, in order: the deterministic
    /// simulation, whose disk is memory.
    Inline,
}

impl StorageIo {
    /// Where a real node's disk work runs: appends inline on a
    /// current-thread runtime, on the blocking pool otherwise.
    pub fn for_this_runtime() -> StorageIo {
        match tokio::runtime::Handle::current().runtime_flavor() {
            tokio::runtime::RuntimeFlavor::CurrentThread => StorageIo::InlineAppends,
            _ => StorageIo::Threads,
        }
    }

    /// Whether a log append holds up the thread that asked for it.
    pub fn appends_inline(self) -> bool {
        self != StorageIo::Threads
    }

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
            StorageIo::Threads | StorageIo::InlineAppends => tokio::task::spawn_blocking(work)
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
    witness: Arc<LazyWitness>,
    /// Writes the witness behind the log (not under `StorageIo::Inline`); the
    /// last clone dropped stops it, after it wrote what was left.
    _witness_writer: Option<Arc<WitnessWriter>>,
    io: StorageIo,
    /// How long each append took to be durable (the metrics').
    append_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Appends made durable so far, for the proposer's pacing.
    appended: Arc<tokio::sync::watch::Sender<u64>>,
    /// How far the snapshot on disk reaches: purges wait for it.
    snapshot_on_disk: SnapshotOnDisk,
    /// Whether the disk is full: appends wait for space meanwhile.
    space: DiskSpace,
}

impl LogStore {
    pub fn new(
        db: Arc<Database>,
        log: LogFile,
        witness: WitnessFile,
        io: StorageIo,
        append_seconds: prometheus_client::metrics::histogram::Histogram,
        snapshot_on_disk: SnapshotOnDisk,
        space: DiskSpace,
    ) -> Self {
        let witness = Arc::new(LazyWitness {
            file: Mutex::new(witness),
            pending: Mutex::default(),
            noted: Condvar::new(),
        });
        LogStore {
            append_seconds,
            appended: Arc::new(tokio::sync::watch::Sender::new(0)),
            index: log.index(),
            log: Arc::new(Mutex::new(log)),
            _witness_writer: (io != StorageIo::Inline)
                .then(|| Arc::new(WitnessWriter::start(witness.clone()))),
            witness,
            io,
            db,
            snapshot_on_disk,
            space,
        }
    }

    /// Counts the appends made durable, from now on.
    pub fn appended(&self) -> tokio::sync::watch::Receiver<u64> {
        self.appended.subscribe()
    }

    fn log(&self) -> std::sync::MutexGuard<'_, LogFile> {
        self.log.lock().expect("log lock poisoned")
    }
}

/// The witness's record of the log's end, written behind the log: an
/// append notes the end it made durable, and the end noted last is written
/// by the [`WitnessWriter`] thread (or, inline, before the next write to
/// storage). A truncation lowers the end at once, and nothing noted before
/// it is written after it: the witness is never ahead of the log.
struct LazyWitness {
    file: Mutex<WitnessFile>,
    pending: Mutex<Pending>,
    noted: Condvar,
}

#[derive(Default)]
struct Pending {
    /// The end noted and not yet written.
    end: Option<Option<LogId<NodeId>>>,
    /// Counts truncations: an end noted before one is never written.
    truncations: u64,
    /// Why writing the witness failed, for the next append to fail with.
    failed: Option<String>,
    stopping: bool,
}

impl LazyWitness {
    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().expect("witness lock poisoned")
    }

    fn file(&self) -> std::sync::MutexGuard<'_, WitnessFile> {
        self.file.lock().expect("witness lock poisoned")
    }

    /// Notes that the log now ends at `end`, durably; an error if writing
    /// the witness has failed.
    fn note_end(&self, end: Option<LogId<NodeId>>) -> std::io::Result<()> {
        let mut pending = self.pending();
        if let Some(failed) = &pending.failed {
            return Err(std::io::Error::other(format!(
                "writing the witness failed: {failed}"
            )));
        }
        pending.end = Some(end);
        self.noted.notify_one();
        Ok(())
    }

    /// Writes the end noted last, if any.
    fn write_pending(&self) -> std::io::Result<()> {
        let (end, truncations) = {
            let mut pending = self.pending();
            match pending.end.take() {
                Some(end) => (end, pending.truncations),
                None => return Ok(()),
            }
        };
        let mut file = self.file();
        if self.pending().truncations != truncations {
            // The log was truncated below it meanwhile.
            return Ok(());
        }
        file.record_last_log(end).inspect_err(|err| {
            self.pending().failed = Some(err.to_string());
        })
    }

    /// Records that the log is about to end at `end`, lower than before,
    /// durably, before the truncation is.
    fn lower_end(&self, end: Option<LogId<NodeId>>) -> std::io::Result<()> {
        {
            let mut pending = self.pending();
            pending.end = None;
            pending.truncations += 1;
        }
        self.file().record_last_log(end)
    }

    fn record_vote(&self, vote: Vote<NodeId>) -> std::io::Result<()> {
        self.write_pending()?;
        self.file().record_vote(vote)
    }
}

/// The least time between two writes of the witness by its thread: how far
/// (at most, plus one fsync) the witness may trail the log when a node
/// crashes.
const WITNESS_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// The thread that writes the witness behind the log.
struct WitnessWriter {
    witness: Arc<LazyWitness>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl WitnessWriter {
    fn start(witness: Arc<LazyWitness>) -> Self {
        let writing = witness.clone();
        let thread = std::thread::Builder::new()
            .name("witness".into())
            .spawn(move || loop {
                {
                    let mut pending = writing.pending();
                    while pending.end.is_none() && !pending.stopping {
                        pending = writing.noted.wait(pending).expect("witness lock poisoned");
                    }
                    if pending.end.is_none() {
                        return;
                    }
                }
                if let Err(err) = writing.write_pending() {
                    tracing::error!(%err, "cannot write the witness; the next append fails");
                }
                // Ends noted meanwhile are written together: one fsync per
                // pause instead of one per append, which the log's own
                // fsyncs would wait behind.
                std::thread::sleep(WITNESS_PAUSE);
            })
            .expect("cannot start the witness thread");
        WitnessWriter {
            witness,
            thread: Some(thread),
        }
    }
}

impl Drop for WitnessWriter {
    /// Stops the thread once it wrote the end noted last: a clean stop
    /// leaves the witness level with the log.
    fn drop(&mut self) {
        self.witness.pending().stopping = true;
        self.witness.noted.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Appends entries and notes the log's new end for the witness (written
/// at once when there is no thread for it: see [`LazyWitness`]).
fn append_noted(
    log: &Mutex<LogFile>,
    witness: &LazyWitness,
    io: StorageIo,
    entries: &[Entry<TypeConfig>],
) -> std::io::Result<()> {
    if io == StorageIo::Inline {
        // The end the previous append noted, before this one.
        witness.write_pending()?;
    }
    let mut log = log.lock().expect("log lock poisoned");
    log.append(entries)?;
    witness.note_end(log.last_log_id())
}

impl LogStore {
    /// Runs `write` (work on the log) here when `inline`, on the blocking
    /// pool otherwise, and again after a wait while it is refused for want
    /// of space (`disk_space.rs`): openraft, which awaits this, waits with
    /// it, and the node stays up. A try that failed part way wrote nothing
    /// the log counts: records count once fsync'd, and the next try writes
    /// them again from where the log's end stood.
    async fn until_written<T: Send + 'static>(
        &self,
        what: &'static str,
        inline: bool,
        write: impl Fn() -> std::io::Result<T> + Send + Sync + 'static,
    ) -> std::io::Result<T> {
        let write = Arc::new(write);
        let (mut waits, mut waiting) = (Waits::new(), None);
        loop {
            let tried = if inline {
                write()
            } else {
                let write = write.clone();
                tokio::task::spawn_blocking(move || write())
                    .await
                    .unwrap_or_else(|panic| {
                        Err(std::io::Error::other(format!("{what} panicked: {panic}")))
                    })
            };
            match tried {
                Err(err) if is_disk_full(&err) => {
                    waiting.get_or_insert_with(|| self.space.wait_for_space(what, &err));
                    tokio::time::sleep(waits.next()).await;
                }
                tried => return tried,
            }
        }
    }
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

    /// Off the async workers: on a full disk the write waits for space
    /// (`disk_space.rs`).
    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let (db, witness, vote) = (self.db.clone(), self.witness.clone(), *vote);
        self.io
            .run(
                move || {
                    write_meta(&db, VOTE_KEY, &vote, ErrorSubject::Vote)?;
                    witness
                        .record_vote(vote)
                        .at(&At(ErrorSubject::Vote, ErrorVerb::Write))
                },
                |panic| StorageIOError::write_vote(panic).into(),
            )
            .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        read_meta(&self.db, VOTE_KEY, ErrorSubject::Vote)
    }

    /// Writes on a blocking thread, unless [`StorageIo::appends_inline`]:
    /// the write waits for the disk, and a tokio worker stalled on fsync
    /// could not serve the network meanwhile. Returns once the entries are
    /// written and readable, as the storage contract requires.
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
        let (log, witness, io) = (self.log.clone(), self.witness.clone(), self.io);
        let written = self
            .until_written("a log append", io.appends_inline(), move || {
                append_noted(&log, &witness, io, &entries)
            })
            .await
            .at(&At(ErrorSubject::Logs, ErrorVerb::Write));
        self.append_seconds.observe(started.elapsed().as_secs_f64());
        // Only after the fsync returned may openraft count these entries as
        // persisted (the witness follows: see `LazyWitness`).
        match &written {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                self.appended.send_modify(|count| *count += 1);
            }
            Err(err) => callback.log_io_completed(Err(std::io::Error::other(err.to_string()))),
        }
        written
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        let (log, witness) = (self.log.clone(), self.witness.clone());
        self.until_written(
            "a log truncation",
            self.io == StorageIo::Inline,
            move || {
                let mut log = log.lock().expect("log lock poisoned");
                // The witness first: a crash between the two leaves the log past
                // its witness, which is allowed; the other order would not be.
                let end = match log_id.index.checked_sub(1) {
                    Some(before) => log.log_id_at_or_purged(before)?,
                    None => None,
                };
                witness.lower_end(end)?;
                log.truncate(log_id.index)
            },
        )
        .await
        .at(&At(ErrorSubject::Logs, ErrorVerb::Delete))
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError> {
        // Never past the snapshot on disk: openraft asks before a snapshot
        // from the leader is written (durable_snapshot.rs).
        self.snapshot_on_disk.covers(&log_id).await?;
        // Durable before returning: from now on `get_log_state` reports the
        // entries up to here as gone, whether or not their segments are.
        // Off the async workers: on a full disk the write waits for space.
        let (db, log) = (self.db.clone(), self.log.clone());
        self.io
            .run(
                move || {
                    write_meta(&db, PURGED_KEY, &log_id, ErrorSubject::Logs)?;
                    log.lock()
                        .expect("log lock poisoned")
                        .purge(log_id)
                        .at(&At(ErrorSubject::Logs, ErrorVerb::Delete))
                },
                |panic| StorageIOError::write_logs(panic).into(),
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::shared_memory::SharedMemory;
    use crate::store::witness::Witness;
    use openraft::CommittedLeaderId;

    fn lazy_witness() -> LazyWitness {
        let file = WitnessFile::create(Box::new(SharedMemory::default()), Witness::new(1)).unwrap();
        LazyWitness {
            file: Mutex::new(file),
            pending: Mutex::default(),
            noted: Condvar::new(),
        }
    }

    fn log_id(index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(1, 1), index))
    }

    /// The witness must never be ahead of the log: an end noted before a
    /// truncation, written after it, would make the next start refuse a
    /// sound log as one that went back.
    #[test]
    fn an_end_noted_before_a_truncation_is_never_written_after_it() {
        let witness = lazy_witness();
        witness.note_end(log_id(10)).unwrap();
        witness.write_pending().unwrap();
        assert_eq!(witness.file().current().last_log, log_id(10));

        witness.note_end(log_id(20)).unwrap();
        witness.lower_end(log_id(15)).unwrap();
        witness.write_pending().unwrap();
        assert_eq!(witness.file().current().last_log, log_id(15));
    }

    /// A vote writes the end noted before it too, so the witness is never
    /// further behind the log than one pause.
    #[test]
    fn a_vote_writes_the_end_noted_before_it() {
        let witness = lazy_witness();
        witness.note_end(log_id(7)).unwrap();
        witness.record_vote(Vote::new(2, 1)).unwrap();
        let current = witness.file().current().clone();
        assert_eq!(
            (current.last_log, current.vote),
            (log_id(7), Some(Vote::new(2, 1)))
        );
    }
}
