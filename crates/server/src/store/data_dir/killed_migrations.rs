//! A migration killed at every step (issue 28, docs/upgrading.md): a
//! directory of the previous format is opened for writing on disks that
//! fail every write after the first N (as a process killed there: what it
//! wrote stays, nothing after it happens), for every N until the migration
//! goes through. Each time, what is left must be one release or the other's:
//! still the old format with its log whole (the release that wrote it opens
//! it as it was), or the new format; and this build must open it and find
//! the same log. Never neither.

use super::super::{encode, At, FORMAT, FORMAT_KEY, FORMAT_LOG_IN_DATABASE, LOG, META};
use super::{open_simulated_disk, SimulatedDisks};
use openraft::{CommittedLeaderId, Entry, EntryPayload, ErrorSubject, ErrorVerb, LogId};
use redb::{Database, ReadableTableMetadata, StorageBackend};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Writes (data, length changes, syncs) [`KillableDisk`]s may still do,
/// over every disk: a kill after that many. Only this module's test uses
/// these disks, so one counter for the process is one per test.
static WRITES_LEFT: AtomicU64 = AtomicU64::new(u64::MAX);

/// A disk in memory whose writes stop, all at once, when
/// [`WRITES_LEFT`] runs out.
#[derive(Debug, Clone, Default)]
struct KillableDisk(Arc<Mutex<Vec<u8>>>);

impl KillableDisk {
    /// An independent copy: a clone shares the bytes.
    fn copy(&self) -> KillableDisk {
        KillableDisk(Arc::new(Mutex::new(self.bytes().clone())))
    }

    /// The bytes, also after a panic while they were held (a storage
    /// library that panics on a failed write is one of the outcomes).
    fn bytes(&self) -> std::sync::MutexGuard<'_, Vec<u8>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Spends one write, or fails if the process is "killed".
fn spend_write() -> io::Result<()> {
    WRITES_LEFT
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            left.checked_sub(1)
        })
        .map(drop)
        .map_err(|_| io::Error::other("killed here by the test"))
}

impl StorageBackend for KillableDisk {
    fn len(&self) -> io::Result<u64> {
        Ok(self.bytes().len() as u64)
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let bytes = self.bytes();
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        bytes
            .get(start..start + len)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "read past the end"))
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        spend_write()?;
        let len = usize::try_from(len).map_err(io::Error::other)?;
        self.bytes().resize(len, 0);
        Ok(())
    }

    fn sync_data(&self, _eventual: bool) -> io::Result<()> {
        spend_write()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        spend_write()?;
        let start = usize::try_from(offset).map_err(io::Error::other)?;
        let mut bytes = self.bytes();
        if bytes.len() < start + data.len() {
            bytes.resize(start + data.len(), 0);
        }
        bytes[start..start + data.len()].copy_from_slice(data);
        Ok(())
    }
}

const ENTRIES: u64 = 50;

fn log_id(index: u64) -> LogId<crate::raft_types::NodeId> {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

/// A node's disks holding a format-11 directory: its log of [`ENTRIES`]
/// entries in a table of its database, as that format kept it.
fn format_11_directory() -> SimulatedDisks<KillableDisk> {
    let disks = SimulatedDisks::<KillableDisk>::default();
    let mut opened = open_simulated_disk(&disks, 1).unwrap();
    let at = At(ErrorSubject::Logs, ErrorVerb::Write);
    let txn = opened.db.begin_write().unwrap();
    {
        let mut table = txn.open_table(LOG).unwrap();
        for index in 0..ENTRIES {
            let entry = Entry::<crate::raft_types::TypeConfig> {
                log_id: log_id(index),
                payload: EntryPayload::Blank,
            };
            let encoded = encode(&entry, &at).unwrap();
            table.insert(index, encoded.as_slice()).unwrap();
        }
        let mut meta = txn.open_table(META).unwrap();
        meta.insert(FORMAT_KEY, FORMAT_LOG_IN_DATABASE).unwrap();
    }
    txn.commit().unwrap();
    opened
        .witness
        .record_last_log(Some(log_id(ENTRIES - 1)))
        .unwrap();
    drop(opened);
    disks
}

/// The format marker of the database on `disk` and how many entries its
/// log table holds (read on a copy: opening may repair).
fn marker_and_table(disk: &KillableDisk) -> (Vec<u8>, Option<u64>) {
    let db = Database::builder()
        .create_with_backend(disk.copy())
        .expect("the database opens");
    let txn = db.begin_read().unwrap();
    let meta = txn.open_table(META).unwrap();
    let marker = meta.get(FORMAT_KEY).unwrap().unwrap().value().to_vec();
    let entries = txn.open_table(LOG).ok().map(|table| table.len().unwrap());
    (marker, entries)
}

#[test]
fn a_migration_killed_at_every_step_leaves_one_release_or_the_others_directory() {
    let original = format_11_directory();
    // Kills that left the old format, and the new one.
    let (mut left_old, mut left_new) = (0, 0);
    for writes in 0.. {
        let attempt = original.map(KillableDisk::copy);
        WRITES_LEFT.store(writes, Ordering::SeqCst);
        let opened = std::panic::catch_unwind(|| open_simulated_disk(&attempt, 1).map(drop));
        WRITES_LEFT.store(u64::MAX, Ordering::SeqCst);
        let went_through = matches!(opened, Ok(Ok(())));

        let (marker, entries) = marker_and_table(&attempt.db);
        if marker == FORMAT_LOG_IN_DATABASE {
            assert_eq!(
                entries,
                Some(ENTRIES),
                "killed after {writes} writes: format 11 with its log not whole"
            );
            left_old += 1;
        } else {
            assert_eq!(marker, FORMAT, "killed after {writes} writes");
            left_new += usize::from(!went_through);
        }
        let reopened = open_simulated_disk(&attempt, 1)
            .unwrap_or_else(|err| panic!("killed after {writes} writes, it does not open: {err}"));
        let report = reopened
            .report
            .clone()
            .expect("an existing directory is checked");
        assert_eq!(
            (report.log_first, report.log_last),
            (Some(0), Some(ENTRIES - 1)),
            "killed after {writes} writes"
        );
        drop(reopened);
        let (marker, entries) = marker_and_table(&attempt.db);
        assert_eq!((marker.as_slice(), entries), (FORMAT, None));
        if went_through {
            break;
        }
    }
    // Killed on both sides of the marker's raise, many times on the way.
    assert!(
        left_old > 5 && left_new > 0,
        "{left_old} kills left format 11, {left_new} format 12"
    );
}
