//! [`ReadOnlyOverlay`]: a redb storage backend that reads a database and
//! keeps every write in memory, so a database can be opened, recovered and
//! checked without changing a byte of it.
//!
//! Why: redb 2 has no read-only mode, and opening a database can write to it
//! (crash recovery, or a repair that falls back to an older commit). A
//! damaged file must be judged before anything touches it: once refused, it
//! is still exactly what the operator, `deadbolt data check` or a support
//! engineer needs to look at.

use redb::StorageBackend;
use std::collections::HashMap;
use std::io;
use std::sync::Mutex;

/// Writes are kept in blocks of this size.
const BLOCK: u64 = 4096;

#[derive(Debug)]
pub struct ReadOnlyOverlay {
    base: Box<dyn StorageBackend>,
    changes: Mutex<Changes>,
}

#[derive(Debug)]
struct Changes {
    len: u64,
    /// Blocks written (or cut by `set_len`), by block number.
    blocks: HashMap<u64, Vec<u8>>,
}

impl ReadOnlyOverlay {
    pub fn new(base: Box<dyn StorageBackend>) -> io::Result<Self> {
        let len = base.len()?;
        Ok(ReadOnlyOverlay {
            base,
            changes: Mutex::new(Changes {
                len,
                blocks: HashMap::new(),
            }),
        })
    }
}

impl ReadOnlyOverlay {
    /// Block `number` as it now reads: changed, from the base, or zeros past
    /// the base's end.
    fn block(&self, changes: &Changes, number: u64) -> io::Result<Vec<u8>> {
        if let Some(block) = changes.blocks.get(&number) {
            return Ok(block.clone());
        }
        let start = number * BLOCK;
        let base_len = self.base.len()?;
        let mut block = vec![0; BLOCK as usize];
        if start < base_len {
            let available = (base_len - start).min(BLOCK) as usize;
            block[..available].copy_from_slice(&self.base.read(start, available)?);
        }
        Ok(block)
    }

    fn changes(&self) -> std::sync::MutexGuard<'_, Changes> {
        self.changes.lock().expect("overlay lock poisoned")
    }
}

fn beyond_the_end() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "read beyond the end of the database file",
    )
}

impl StorageBackend for ReadOnlyOverlay {
    fn len(&self) -> io::Result<u64> {
        Ok(self.changes().len)
    }

    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        let changes = self.changes();
        let end = offset.checked_add(len as u64).ok_or_else(beyond_the_end)?;
        if end > changes.len {
            return Err(beyond_the_end());
        }
        let mut out = Vec::with_capacity(len);
        let mut at = offset;
        while at < end {
            let block = self.block(&changes, at / BLOCK)?;
            let from = (at % BLOCK) as usize;
            let to = ((end - at / BLOCK * BLOCK).min(BLOCK)) as usize;
            out.extend_from_slice(&block[from..to]);
            at = at / BLOCK * BLOCK + to as u64;
        }
        Ok(out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut changes = self.changes();
        if len < changes.len {
            // The cut part reads as zeros if the file grows again.
            let last = len / BLOCK;
            let mut block = self.block(&changes, last)?;
            block[(len % BLOCK) as usize..].fill(0);
            changes.blocks.insert(last, block);
            let dropped = (last + 1)..=(changes.len / BLOCK);
            for number in dropped {
                changes.blocks.insert(number, vec![0; BLOCK as usize]);
            }
        }
        changes.len = len;
        Ok(())
    }

    fn sync_data(&self, _eventual: bool) -> io::Result<()> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut changes = self.changes();
        let end = offset + data.len() as u64;
        let mut at = offset;
        while at < end {
            let number = at / BLOCK;
            let mut block = self.block(&changes, number)?;
            let from = (at % BLOCK) as usize;
            let to = ((end - number * BLOCK).min(BLOCK)) as usize;
            let written = (at - offset) as usize;
            block[from..to].copy_from_slice(&data[written..written + (to - from)]);
            changes.blocks.insert(number, block);
            at = number * BLOCK + to as u64;
        }
        changes.len = changes.len.max(end);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::backends::InMemoryBackend;

    #[test]
    fn writes_land_in_memory_and_reads_see_them_across_block_edges() {
        let base = InMemoryBackend::new();
        base.set_len(10_000).unwrap();
        base.write(0, &vec![1; 10_000]).unwrap();
        let overlay = ReadOnlyOverlay::new(Box::new(base)).unwrap();
        overlay.write(4090, &[7; 20]).unwrap();
        overlay.write(12_000, &[9; 5]).unwrap();
        assert_eq!(overlay.len().unwrap(), 12_005);
        let read = overlay.read(4080, 40).unwrap();
        assert_eq!(&read[..10], &[1; 10]);
        assert_eq!(&read[10..30], &[7; 20]);
        assert_eq!(&read[30..], &[1; 10]);
        assert_eq!(overlay.read(11_999, 6).unwrap(), vec![0, 9, 9, 9, 9, 9]);
        assert!(overlay.read(12_000, 6).is_err());
        overlay.set_len(4095).unwrap();
        overlay.set_len(8192).unwrap();
        assert_eq!(overlay.read(4089, 3).unwrap(), vec![1, 7, 7]);
        assert_eq!(overlay.read(4094, 2).unwrap(), vec![7, 0]);
        assert_eq!(overlay.read(5000, 4).unwrap(), vec![0; 4]);
        // The base never changed.
        assert_eq!(overlay.base.len().unwrap(), 10_000);
        assert_eq!(overlay.base.read(4090, 20).unwrap(), vec![1; 20]);
    }
}
