//! Where the log's segments ([`SegmentDir`], `log_file.rs`) are kept: files
//! in the data directory ([`DirSegments`]), or simulated disks
//! ([`SimulatedSegments`]), so that the simulation's crash model covers the
//! same code a real node runs.

use super::log_file::SegmentDir;
use redb::StorageBackend;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A segment file's size: some seconds of appends at full speed; the next
/// one is zero-filled meanwhile (`LogFile`).
const SEGMENT_FILE_BYTES: u64 = 16 << 20;
/// The zeros a new segment file is filled with go in writes of this many
/// bytes. Why not larger: Linux (6.16 on, ext4) caches what one write puts
/// in a file in folios as large as the write, up to 2 MiB, and every later
/// write into such a folio walks all of its blocks, as its fdatasync does.
/// Appends of 1.5 KB into a file zero-filled by 1 MiB writes cost 47-70 µs
/// of CPU each (two writes and the fdatasync), into one filled by 64 KiB
/// writes 38-55 µs, no more than by 4 KiB writes (39-59 µs); filling 16 MiB
/// takes 5-7 ms of CPU by 64 KiB writes, 17-23 ms by 4 KiB writes and 4-5
/// ms by 1 MiB writes (bench/results/2026-12-06.md).
const ZERO_FILL_WRITE: usize = 64 << 10;
/// A simulated segment's size: small, so that runs go through many.
const SIMULATED_SEGMENT_BYTES: u64 = 64 << 10;

/// Segment files are named this, then their number.
pub const SEGMENT_PREFIX: &str = "deadbolt-log-";

/// The segment files of a data directory.
pub struct DirSegments {
    dir: PathBuf,
    segment_bytes: u64,
    /// `false` for `deadbolt data check` and the checks before a start:
    /// files opened read-only cannot be changed by mistake.
    writable: bool,
}

impl DirSegments {
    pub fn new(dir: &Path, writable: bool) -> Self {
        DirSegments {
            dir: dir.to_owned(),
            segment_bytes: SEGMENT_FILE_BYTES,
            writable,
        }
    }

    /// Segments of `bytes` instead: a test's, to go through several.
    #[cfg(test)]
    fn with_segment_bytes(self, bytes: u64) -> Self {
        DirSegments {
            segment_bytes: bytes,
            ..self
        }
    }

    fn path(&self, number: u64) -> PathBuf {
        self.dir.join(format!("{SEGMENT_PREFIX}{number:016}"))
    }
}

fn segment_number(name: &str) -> Option<u64> {
    name.strip_prefix(SEGMENT_PREFIX)?.parse().ok()
}

impl SegmentDir for DirSegments {
    fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    fn creates_ahead(&self) -> bool {
        true
    }

    fn describe(&self, number: u64) -> String {
        self.path(number).display().to_string()
    }

    fn list(&self) -> io::Result<Vec<u64>> {
        let mut numbers = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            if let Some(number) = segment_number(&entry?.file_name().to_string_lossy()) {
                numbers.push(number);
            }
        }
        numbers.sort_unstable();
        Ok(numbers)
    }

    fn open(&self, number: u64) -> io::Result<Arc<dyn StorageBackend>> {
        let file = OpenOptions::new()
            .read(true)
            .write(self.writable)
            .open(self.path(number))?;
        Ok(Arc::new(SegmentFile(file)))
    }

    fn sync_names(&self) -> io::Result<()> {
        File::open(&self.dir)?.sync_all()
    }

    fn create(&self, number: u64, len: u64) -> io::Result<Arc<dyn StorageBackend>> {
        assert!(self.writable, "a segment created through a read-only view");
        let path = self.path(number);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        let filled = zero_fill(&mut file, len).and_then(|()| File::open(&self.dir)?.sync_all());
        if let Err(err) = filled {
            // Nothing half made is left behind, so that a try after space
            // came back creates the same segment afresh (no record was
            // written into this one).
            let _ = std::fs::remove_file(&path);
            return Err(err);
        }
        Ok(Arc::new(SegmentFile(file)))
    }

    fn remove(&self, number: u64) -> io::Result<()> {
        // Not synced: a segment a crash brings back is removed again at
        // the next start.
        std::fs::remove_file(self.path(number))
    }
}

/// Fills `file` with `len` zeros, durably. Zeros written, not a sparse
/// file: an fdatasync into a hole must allocate blocks and journal it,
/// about twice the cost.
fn zero_fill(file: &mut File, len: u64) -> io::Result<()> {
    let zeros = vec![0u8; ZERO_FILL_WRITE];
    let mut left = len;
    while left > 0 {
        let chunk = left.min(zeros.len() as u64) as usize;
        file.write_all(&zeros[..chunk])?;
        left -= chunk as u64;
    }
    file.sync_all()
}

/// A segment file, read and written at offsets.
#[derive(Debug)]
struct SegmentFile(File);

impl StorageBackend for SegmentFile {
    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut bytes = vec![0; len];
        self.0.read_exact_at(&mut bytes, offset)?;
        Ok(bytes)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self, _eventual: bool) -> io::Result<()> {
        self.0.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write_all_at(data, offset)
    }
}

/// A node's log segments on simulated disks, one per segment, shared by
/// clones. Creating and removing a segment is durable at once (a real
/// directory is synced after each creation; a removal a crash undoes is
/// done again).
#[derive(Debug, Clone, Default)]
pub struct SimulatedSegments<D> {
    disks: Arc<Mutex<BTreeMap<u64, D>>>,
}

impl<D: Clone> SimulatedSegments<D> {
    /// The same change to each segment's disk: a crash, a synced image.
    pub fn map(&self, change: impl FnMut(&D) -> D) -> Self {
        let mut change = change;
        let disks = self.disks();
        SimulatedSegments {
            disks: Arc::new(Mutex::new(
                disks
                    .iter()
                    .map(|(&number, disk)| (number, change(disk)))
                    .collect(),
            )),
        }
    }

    /// Each segment's disk, by number.
    pub fn each(&self) -> Vec<(u64, D)> {
        self.disks()
            .iter()
            .map(|(&number, disk)| (number, disk.clone()))
            .collect()
    }

    /// Puts `disk` in place of segment `number`.
    pub fn replace(&self, number: u64, disk: D) {
        self.disks().insert(number, disk);
    }

    fn disks(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, D>> {
        self.disks.lock().expect("segments lock poisoned")
    }
}

impl<D: StorageBackend + Clone + Default> SegmentDir for SimulatedSegments<D> {
    fn segment_bytes(&self) -> u64 {
        SIMULATED_SEGMENT_BYTES
    }

    fn creates_ahead(&self) -> bool {
        false
    }

    fn describe(&self, number: u64) -> String {
        format!("<simulated log segment {number}>")
    }

    fn list(&self) -> io::Result<Vec<u64>> {
        Ok(self.disks().keys().copied().collect())
    }

    fn open(&self, number: u64) -> io::Result<Arc<dyn StorageBackend>> {
        let disk = self.disks().get(&number).cloned();
        let disk = disk.ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        Ok(Arc::new(disk))
    }

    fn sync_names(&self) -> io::Result<()> {
        Ok(())
    }

    fn create(&self, number: u64, len: u64) -> io::Result<Arc<dyn StorageBackend>> {
        let disk = D::default();
        disk.set_len(len)?;
        disk.sync_data(false)?;
        self.disks().insert(number, disk.clone());
        Ok(Arc::new(disk))
    }

    fn remove(&self, number: u64) -> io::Result<()> {
        self.disks().remove(&number);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::log_file::LogFile;
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};

    /// Files, not the simulation's disks: the next segment is created on
    /// a thread once the active one is half full, taken at the rollover,
    /// and every entry reads back after a reopen.
    #[test]
    fn segment_files_roll_over_onto_the_one_created_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let segments = || Arc::new(DirSegments::new(dir.path(), true).with_segment_bytes(64 << 10));
        let mut log = LogFile::open(segments(), None).unwrap();
        let entry = |index| Entry::<crate::raft_types::TypeConfig> {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Blank,
        };
        let mut counts = Vec::new();
        for first in (0..20_000).step_by(100) {
            let batch: Vec<_> = (first..first + 100).map(entry).collect();
            log.append(&batch).unwrap();
            counts.push(segments().list().unwrap().len());
        }
        // A second file appears only once the first is half full.
        assert_eq!(counts[0], 1);
        assert!(counts.last().unwrap() > &4, "{counts:?}");
        drop(log);
        let log = LogFile::open(segments(), None).unwrap();
        let index = log.index();
        let read = index.read().unwrap().read(0..).unwrap();
        assert_eq!(read.len(), 20_000);
        assert!(read
            .iter()
            .enumerate()
            .all(|(at, e)| e.log_id.index == at as u64));
    }

    /// A segment sized for one large record (`LogFile` asks for twice the
    /// record when that is more than the usual size) ends in a part of a
    /// zero-fill write: it must still be zeros to the last byte, and no
    /// longer than asked.
    #[test]
    fn a_segment_of_any_length_is_zeros_to_its_end() {
        let dir = tempfile::tempdir().unwrap();
        let segments = DirSegments::new(dir.path(), true);
        let len = 2 * ZERO_FILL_WRITE as u64 + 1234;
        let segment = segments.create(7, len).unwrap();
        assert_eq!(segment.len().unwrap(), len);
        let bytes = segment.read(0, len as usize).unwrap();
        assert!(bytes.iter().all(|byte| *byte == 0));
        assert_eq!(std::fs::metadata(segments.path(7)).unwrap().len(), len);
    }
}
