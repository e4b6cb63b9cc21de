//! [`DiskSpace`]: whether the data directory's disk is full, and the waits
//! that turn a full disk from an outage into a pause.
//!
//! Why: a full disk is the storage accident operators meet most, and it
//! passes. A node that stopped on it (as before) needed a restart once
//! space came back, and a single node was down until someone noticed.
//! Instead, a write refused for want of space (ENOSPC, or EDQUOT for a
//! quota) is tried again, unchanged, until it goes through:
//!
//! - the log's appends (`log_store.rs`) wait on the async side, so the
//!   node keeps serving what needs no write; Raft, whose core waits for
//!   the append, stops sending heartbeats, and a leader is replaced by a
//!   follower with space within an election timeout;
//! - the databases and the witness go through [`WaitsForSpace`], which
//!   retries the very write redb or the witness asked for. redb must not
//!   see the error at all: after any failed write it refuses every later
//!   one until the database is opened again (`StorageError::PreviousIo`).
//!
//! Meanwhile [`DiskSpace::is_full`] says so: the node refuses new writes
//! with `unavailable: disk full` (their callers go to another node), and
//! the `deadbolt_disk_full` gauge is 1.
//!
//! Why retrying is safe: only a write is tried again, at the same offset
//! with the same bytes, never an fsync. A failed fsync may have dropped
//! the pages it was to make durable, so trying it again could report
//! success for data that is gone; it stays fatal (`log_file.rs` reports
//! it as a failed fsync, whatever the kernel's reason).

use prometheus_client::metrics::gauge::Gauge;
use redb::StorageBackend;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The first wait before a write refused for want of space is tried again.
const FIRST_WAIT: Duration = Duration::from_millis(10);
/// The longest wait between tries: space that comes back is used within
/// this.
const LONGEST_WAIT: Duration = Duration::from_millis(200);

/// Whether the disk under a node's data is full, shared by everything that
/// writes there and read by what refuses writes.
#[derive(Debug, Clone, Default)]
pub struct DiskSpace {
    /// 1 while any write waits for space: what [`is_full`](Self::is_full)
    /// reads, and the metric.
    full: Gauge,
    /// The writes waiting for space. A count, not a flag: a log append
    /// that goes through while a snapshot still waits (the log's segments
    /// are allocated ahead, the snapshot's file grows) leaves the disk full.
    /// Changed under its lock with `full`, on the slow path only.
    waiting: Arc<Mutex<usize>>,
}

/// A write waiting for space; the last one dropped says space is back.
pub struct Waiting<'a>(&'a DiskSpace);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut waiting = self.0.waiting.lock().expect("disk space lock poisoned");
        *waiting -= 1;
        if *waiting == 0 {
            self.0.full.set(0);
            tracing::info!("space is back: writes go through again");
        }
    }
}

impl DiskSpace {
    /// Whether a write is waiting for space now.
    pub fn is_full(&self) -> bool {
        self.full.get() > 0
    }

    /// The gauge the metrics export as `deadbolt_disk_full`.
    pub fn gauge(&self) -> Gauge {
        self.full.clone()
    }

    /// Notes that `what` was refused for want of space and waits for it
    /// until the guard is dropped; the first such write says so.
    pub fn wait_for_space(&self, what: &str, err: &io::Error) -> Waiting<'_> {
        let mut waiting = self.waiting.lock().expect("disk space lock poisoned");
        *waiting += 1;
        if *waiting == 1 {
            self.full.set(1);
            tracing::error!(
                %err,
                "the disk is full: {what} waits for space; this node refuses writes \
                 (unavailable: disk full) until space is freed, and resumes by itself then"
            );
        }
        Waiting(self)
    }

    /// Runs `write` until it is not refused for want of space, waiting
    /// between tries on this thread: for threads of their own (the
    /// witness's, snapshots', the blocking pool), never an async worker.
    pub fn retry_blocking<T>(
        &self,
        what: &str,
        mut write: impl FnMut() -> io::Result<T>,
    ) -> io::Result<T> {
        let (mut waits, mut waiting) = (Waits::new(), None);
        loop {
            match write() {
                Err(err) if is_disk_full(&err) => {
                    waiting.get_or_insert_with(|| self.wait_for_space(what, &err));
                    std::thread::sleep(waits.next());
                }
                written => return written,
            }
        }
    }
}

/// Whether `err` is a write refused for want of space (a full file system
/// or a quota), which a later try of the same write may get through.
pub fn is_disk_full(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    )
}

/// The waits between tries: doubling from [`FIRST_WAIT`] to
/// [`LONGEST_WAIT`].
pub struct Waits {
    next: Duration,
}

impl Waits {
    pub fn new() -> Self {
        Waits { next: FIRST_WAIT }
    }

    /// The wait before the next try.
    pub fn next(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(LONGEST_WAIT);
        wait
    }
}

/// A storage backend whose writes wait for space instead of failing on a
/// full disk: for the databases (redb) and the witness.
#[derive(Debug)]
pub struct WaitsForSpace<B> {
    inner: B,
    space: DiskSpace,
}

impl<B> WaitsForSpace<B> {
    pub fn new(inner: B, space: DiskSpace) -> Self {
        WaitsForSpace { inner, space }
    }
}

impl<B: StorageBackend> StorageBackend for WaitsForSpace<B> {
    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.inner.read(offset, len)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.space
            .retry_blocking("growing a database file", || self.inner.set_len(len))
    }

    /// Never tried again: see the module's comment.
    fn sync_data(&self, eventual: bool) -> io::Result<()> {
        self.inner.sync_data(eventual)
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.space
            .retry_blocking("a database write", || self.inner.write(offset, data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::shared_memory::SharedMemory;
    use redb::ReadableTable;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A disk that refuses the next `refusals` writes for want of space.
    #[derive(Debug, Clone, Default)]
    struct FillsUp {
        memory: SharedMemory,
        refusals: Arc<AtomicUsize>,
    }

    impl StorageBackend for FillsUp {
        fn len(&self) -> io::Result<u64> {
            self.memory.len()
        }
        fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
            self.memory.read(offset, len)
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.memory.set_len(len)
        }
        fn sync_data(&self, eventual: bool) -> io::Result<()> {
            self.memory.sync_data(eventual)
        }
        fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
            let refused = self
                .refusals
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if refused.is_ok() {
                return Err(io::Error::from(io::ErrorKind::StorageFull));
            }
            self.memory.write(offset, data)
        }
    }

    /// redb refuses every write after one that failed until the database is
    /// opened again: behind `WaitsForSpace`, a commit made while the disk
    /// is full goes through once space is back, and so do later ones.
    #[test]
    fn a_database_commit_on_a_full_disk_waits_for_space_and_the_next_ones_work() {
        const TABLE: redb::TableDefinition<u64, u64> = redb::TableDefinition::new("t");
        let disk = FillsUp::default();
        let space = DiskSpace::default();
        let db = redb::Database::builder()
            .create_with_backend(WaitsForSpace::new(disk.clone(), space.clone()))
            .unwrap();
        let commit = |value: u64| {
            let txn = db.begin_write().unwrap();
            txn.open_table(TABLE).unwrap().insert(value, value).unwrap();
            txn.commit()
        };
        commit(1).unwrap();

        disk.refusals.store(5, Ordering::SeqCst);
        commit(2).expect("the commit waited for space");
        assert_eq!(disk.refusals.load(Ordering::SeqCst), 0);
        assert!(!space.is_full(), "space came back and a write went through");
        commit(3).expect("later commits work too");

        let read = db.begin_read().unwrap();
        let table = read.open_table(TABLE).unwrap();
        let values: Vec<u64> = table
            .iter()
            .unwrap()
            .map(|row| row.unwrap().1.value())
            .collect();
        assert_eq!(values, [1, 2, 3]);
    }

    /// A log append that goes through (into a segment allocated ahead)
    /// while a snapshot still waits to grow its file leaves the disk full:
    /// writes stay refused until the last waiting write is done.
    #[test]
    fn the_disk_is_full_while_any_write_waits() {
        let space = DiskSpace::default();
        let err = io::Error::from(io::ErrorKind::StorageFull);
        let snapshot = space.wait_for_space("a snapshot", &err);
        let append = space.wait_for_space("a log append", &err);
        drop(append);
        assert!(space.is_full(), "the snapshot still waits");
        drop(snapshot);
        assert!(!space.is_full());
        assert_eq!(space.gauge().get(), 0);
    }

    /// An error other than a full disk is not tried again: a failed read,
    /// a damaged file, a failed fsync are what they are.
    #[test]
    fn only_a_full_disk_is_waited_out() {
        let space = DiskSpace::default();
        let mut tries = 0;
        let failed = space.retry_blocking("a write", || -> io::Result<()> {
            tries += 1;
            Err(io::Error::from(io::ErrorKind::PermissionDenied))
        });
        assert!(failed.is_err());
        assert_eq!(tries, 1);
        assert!(!space.is_full());

        let mut tries = 0;
        space
            .retry_blocking("a write", || {
                tries += 1;
                if tries < 3 {
                    Err(io::Error::from(io::ErrorKind::QuotaExceeded))
                } else {
                    Ok(())
                }
            })
            .unwrap();
        assert_eq!(tries, 3);
    }
}
