//! [`SimDisk`]: a node's disk in memory, as a redb storage backend, that
//! remembers which writes were synced. A simulated crash keeps everything
//! synced and, of the writes since the last sync, a random subset: the
//! kernel may have written any of them back, in any order, before power was
//! lost, and a write of several sectors may be torn, only some of them
//! written. A sync can be made to fail ([`SimDisk::fail_next_sync`]), as a
//! disk that could not write back does.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redb::StorageBackend;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Default)]
pub struct SimDisk {
    state: Arc<Mutex<DiskState>>,
}

#[derive(Debug, Default)]
struct DiskState {
    /// What reads see.
    current: Vec<u8>,
    /// What a crash is certain to keep.
    synced: Vec<u8>,
    /// Writes since the last sync, oldest first.
    unsynced: Vec<Write>,
    /// Armed by [`SimDisk::fail_next_sync`]: the draw that decides which
    /// writes the failing sync loses.
    failing: Option<u64>,
    /// Syncs that failed. After one, what reads see may differ from what
    /// the disk holds for good.
    failed_syncs: u32,
}

#[derive(Debug, Hash)]
enum Write {
    Bytes { offset: usize, data: Vec<u8> },
    Length(usize),
}

impl Write {
    fn apply(&self, bytes: &mut Vec<u8>) {
        match self {
            Write::Bytes { offset, data } => {
                let end = offset + data.len();
                // A write that a crash keeps without the length change
                // before it still lands (a file grows when written past
                // its end).
                if bytes.len() < end {
                    bytes.resize(end, 0);
                }
                bytes[*offset..end].copy_from_slice(data);
            }
            Write::Length(length) => bytes.resize(*length, 0),
        }
    }

    /// Lands what the crash (or failed sync) drawn as `draw` keeps of
    /// this write on `bytes`: all of it with probability `keep`, except that
    /// one in [`TORN`] of those is torn, only some of its sectors landing;
    /// else nothing. Decided by the write itself (where, what), not by its
    /// place among the unsynced writes.
    fn land(&self, draw: u64, keep: f64, bytes: &mut Vec<u8>) {
        let mut hasher = DefaultHasher::new();
        draw.hash(&mut hasher);
        self.hash(&mut hasher);
        let mut rng = StdRng::seed_from_u64(hasher.finish());
        if !rng.gen_bool(keep) {
            return;
        }
        match self {
            Write::Bytes { offset, data } if data.len() > SECTOR && rng.gen_bool(TORN) => {
                for (at, sector) in data.chunks(SECTOR).enumerate() {
                    if rng.gen_bool(0.5) {
                        let sector = Write::Bytes {
                            offset: offset + at * SECTOR,
                            data: sector.to_vec(),
                        };
                        sector.apply(bytes);
                    }
                }
            }
            _ => self.apply(bytes),
        }
    }
}

/// What a disk writes whole or not at all, when power is lost.
const SECTOR: usize = 512;
/// The share of the unsynced writes a crash keeps that it tears.
const TORN: f64 = 0.2;

fn out_of_range() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "beyond the end of the disk")
}

impl SimDisk {
    fn state(&self) -> std::sync::MutexGuard<'_, DiskState> {
        self.state.lock().expect("disk lock poisoned")
    }

    /// The disk a crash leaves: all synced writes, and each unsynced one
    /// with probability `keep`.
    ///
    /// Which writes are kept does not depend on their order: redb writes
    /// the pages of a commit in the order of a `HashMap`, which differs from
    /// run to run, so a draw per write in turn kept other pages in each run
    /// of one seed. Only the order of writes that do not overlap changes (a
    /// flush writes each page once, and pages do not overlap), so applying
    /// the kept writes in the order they came gives the same bytes.
    pub fn after_crash(&self, keep: f64, rng: &mut impl Rng) -> SimDisk {
        let state = self.state();
        let crash = rng.gen();
        let mut bytes = state.synced.clone();
        for write in &state.unsynced {
            write.land(crash, keep, &mut bytes);
        }
        SimDisk::holding(bytes)
    }

    /// A disk holding exactly `bytes`, all of it synced.
    fn holding(bytes: Vec<u8>) -> SimDisk {
        SimDisk {
            state: Arc::new(Mutex::new(DiskState {
                current: bytes.clone(),
                synced: bytes,
                ..DiskState::default()
            })),
        }
    }

    /// Makes the next sync fail with an I/O error, as Linux reports a
    /// failed write-back: it then marks the pages clean, so each write
    /// since the last sync reaches the disk or is gone for good (here, each
    /// with even odds), while reads still see all of them. A later sync
    /// succeeds and makes nothing of the lost writes durable: a server that
    /// retries a failed fsync and trusts it (PostgreSQL's fsync bug) loses
    /// what it acknowledged, and the next crash shows it.
    pub fn fail_next_sync(&self, rng: &mut impl Rng) {
        self.state().failing = Some(rng.gen());
    }

    /// How many syncs of this disk failed.
    pub fn failed_syncs(&self) -> u32 {
        self.state().failed_syncs
    }

    /// Feeds what reads see into `hasher`.
    pub fn hash_contents(&self, hasher: &mut impl Hasher) {
        self.state().current.hash(hasher);
    }

    /// A copy of what this disk is certain to keep: an image to roll a
    /// disk back to later, as an old backup or a stale copy would.
    pub fn synced_image(&self) -> SimDisk {
        SimDisk::holding(self.state().synced.clone())
    }

    /// A copy of the synced disk with one bit flipped in each of `count`
    /// bytes that hold data (not zero): a disk that damaged what it held.
    pub fn with_flipped_bits(&self, count: usize, rng: &mut impl Rng) -> SimDisk {
        let mut bytes = self.state().synced.clone();
        let holding: Vec<usize> = (0..bytes.len()).filter(|&at| bytes[at] != 0).collect();
        for _ in 0..count {
            if let Some(&at) = holding.get(rng.gen_range(0..holding.len().max(1))) {
                bytes[at] ^= 1 << rng.gen_range(0..8);
            }
        }
        SimDisk::holding(bytes)
    }

    /// Writes not yet synced; for the tests of this module.
    #[cfg(test)]
    fn unsynced_writes(&self) -> usize {
        self.state().unsynced.len()
    }
}

impl StorageBackend for SimDisk {
    fn len(&self) -> io::Result<u64> {
        Ok(self.state().current.len() as u64)
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let state = self.state();
        let offset = usize::try_from(offset).map_err(|_| out_of_range())?;
        state
            .current
            .get(offset..offset + len)
            .map(<[u8]>::to_vec)
            .ok_or_else(out_of_range)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| out_of_range())?;
        let mut state = self.state();
        state.current.resize(len, 0);
        state.unsynced.push(Write::Length(len));
        Ok(())
    }

    fn sync_data(&self, _eventual: bool) -> io::Result<()> {
        let mut state = self.state();
        let failing = state.failing.take();
        let DiskState {
            synced, unsynced, ..
        } = &mut *state;
        for write in unsynced.drain(..) {
            match failing {
                Some(draw) => write.land(draw, 0.5, synced),
                None => write.apply(synced),
            }
        }
        if failing.is_some() {
            state.failed_syncs += 1;
            return Err(io::Error::other(
                "simulated I/O error: the disk could not write back (EIO)",
            ));
        }
        debug_assert!(
            state.failed_syncs > 0 || state.synced == state.current,
            "a sync makes the disk whole"
        );
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let offset = usize::try_from(offset).map_err(|_| out_of_range())?;
        let mut state = self.state();
        let target = state
            .current
            .get_mut(offset..offset + data.len())
            .ok_or_else(out_of_range)?;
        target.copy_from_slice(data);
        state.unsynced.push(Write::Bytes {
            offset,
            data: data.to_vec(),
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_keeps_what_was_synced_and_may_lose_the_rest() {
        let disk = SimDisk::default();
        disk.set_len(8).unwrap();
        disk.write(0, b"synced").unwrap();
        disk.sync_data(false).unwrap();
        disk.write(0, b"lost!!").unwrap();
        assert_eq!(disk.unsynced_writes(), 1);
        let mut rng = StdRng::seed_from_u64(1);

        let crashed = disk.after_crash(0.0, &mut rng);
        assert_eq!(crashed.read(0, 6).unwrap(), b"synced");
        let lucky = disk.after_crash(1.0, &mut rng);
        assert_eq!(lucky.read(0, 6).unwrap(), b"lost!!");
        // The running disk is untouched by either.
        assert_eq!(disk.read(0, 6).unwrap(), b"lost!!");
    }

    #[test]
    fn a_crash_keeps_the_same_writes_whatever_order_they_came_in() {
        let pages: Vec<(u64, Vec<u8>)> = (0..16u8)
            .map(|i| (u64::from(i) * 4, vec![i + 1; 4]))
            .collect();
        let disk_of = |order: &mut dyn Iterator<Item = &(u64, Vec<u8>)>| {
            let disk = SimDisk::default();
            disk.set_len(64).unwrap();
            disk.sync_data(false).unwrap();
            for (offset, data) in order {
                disk.write(*offset, data).unwrap();
            }
            disk
        };
        let forward = disk_of(&mut pages.iter());
        let backward = disk_of(&mut pages.iter().rev());
        for seed in 0..8 {
            let kept = |disk: &SimDisk| {
                let crashed = disk.after_crash(0.5, &mut StdRng::seed_from_u64(seed));
                crashed.read(0, 64).unwrap()
            };
            assert_eq!(kept(&forward), kept(&backward), "seed {seed}");
        }
        let some = forward.after_crash(0.5, &mut StdRng::seed_from_u64(0));
        let bytes = some.read(0, 64).unwrap();
        assert!(
            bytes.contains(&0) && bytes.iter().any(|&byte| byte != 0),
            "a crash keeps some of the writes, not all: {bytes:?}"
        );
    }

    #[test]
    fn a_failed_sync_may_lose_writes_that_a_later_sync_does_not_bring_back() {
        let disk = SimDisk::default();
        disk.set_len(64).unwrap();
        disk.sync_data(false).unwrap();
        for page in 0..16u8 {
            disk.write(u64::from(page) * 4, &[page + 1; 4]).unwrap();
        }
        disk.fail_next_sync(&mut StdRng::seed_from_u64(3));
        assert!(disk.sync_data(false).is_err(), "the armed sync fails");
        assert_eq!(disk.failed_syncs(), 1);
        // Reads still see every write, and the next sync succeeds...
        let seen = disk.read(0, 64).unwrap();
        assert!(seen.iter().all(|&byte| byte != 0), "{seen:?}");
        disk.sync_data(false).unwrap();
        // ...yet a crash shows that some of them never reached the disk.
        let after = disk.after_crash(1.0, &mut StdRng::seed_from_u64(4));
        let kept = after.read(0, 64).unwrap();
        assert!(kept.contains(&0), "some writes were lost: {kept:?}");
        assert!(
            kept.iter().any(|&byte| byte != 0),
            "some were kept: {kept:?}"
        );
    }

    #[test]
    fn a_crash_tears_some_writes_of_several_sectors() {
        let disk = SimDisk::default();
        disk.set_len(64 * SECTOR as u64).unwrap();
        disk.sync_data(false).unwrap();
        for write in 0..16u8 {
            let data = vec![write + 1; 4 * SECTOR];
            disk.write(u64::from(write) * 4 * SECTOR as u64, &data)
                .unwrap();
        }
        let crashed = disk.after_crash(1.0, &mut StdRng::seed_from_u64(5));
        let bytes = crashed.read(0, 64 * SECTOR).unwrap();
        let torn = bytes
            .chunks(4 * SECTOR)
            .filter(|write| write.contains(&0) && write.iter().any(|&byte| byte != 0))
            .count();
        assert!(torn > 0, "some writes are torn");
        for sector in bytes.chunks(SECTOR) {
            assert!(
                sector.iter().all(|&byte| byte == sector[0]),
                "a sector lands whole or not at all"
            );
        }
    }

    #[test]
    fn reads_and_writes_past_the_end_are_errors() {
        let disk = SimDisk::default();
        disk.set_len(4).unwrap();
        assert!(disk.write(2, b"abc").is_err());
        assert!(disk.read(3, 2).is_err());
    }
}
