//! [`SharedMemory`]: an in-memory disk for tests, whose clones share its
//! bytes, so that a test can still look into (and damage) a disk after
//! handing it to a store.

use redb::backends::InMemoryBackend;
use redb::StorageBackend;
use std::io;
use std::sync::Arc;

#[derive(Debug, Clone, Default)]
pub struct SharedMemory(Arc<InMemoryBackend>);

impl StorageBackend for SharedMemory {
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn read(&self, offset: u64, len: usize) -> io::Result<Vec<u8>> {
        self.0.read(offset, len)
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync_data(&self, eventual: bool) -> io::Result<()> {
        self.0.sync_data(eventual)
    }
    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.write(offset, data)
    }
}
