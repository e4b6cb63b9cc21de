//! [`SimDisk`]: a node's disk in memory, as a redb storage backend, that
//! remembers which writes were synced. A simulated crash keeps everything
//! synced and, of the writes since the last sync, a random subset: the
//! kernel may have written any of them back, in any order, before power was
//! lost.

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

    /// Whether the crash drawn as `crash` keeps this write: with
    /// probability `keep`, decided by the write itself (where, what), not
    /// by its place among the unsynced writes.
    fn kept(&self, crash: u64, keep: f64) -> bool {
        let mut hasher = DefaultHasher::new();
        crash.hash(&mut hasher);
        self.hash(&mut hasher);
        StdRng::seed_from_u64(hasher.finish()).gen_bool(keep)
    }
}

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
            if write.kept(crash, keep) {
                write.apply(&mut bytes);
            }
        }
        SimDisk::holding(bytes)
    }

    /// A disk holding exactly `bytes`, all of it synced.
    fn holding(bytes: Vec<u8>) -> SimDisk {
        SimDisk {
            state: Arc::new(Mutex::new(DiskState {
                current: bytes.clone(),
                synced: bytes,
                unsynced: Vec::new(),
            })),
        }
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
        let DiskState {
            synced, unsynced, ..
        } = &mut *state;
        for write in unsynced.drain(..) {
            write.apply(synced);
        }
        debug_assert!(state.synced == state.current, "a sync makes the disk whole");
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
    fn reads_and_writes_past_the_end_are_errors() {
        let disk = SimDisk::default();
        disk.set_len(4).unwrap();
        assert!(disk.write(2, b"abc").is_err());
        assert!(disk.read(3, 2).is_err());
    }
}
