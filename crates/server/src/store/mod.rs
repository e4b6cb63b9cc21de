//! Durable state: the Raft log in segment files of its own (`log_file.rs`),
//! the vote and the purge marker in one redb file, the latest snapshot of
//! the lock table in another (why two: `data_dir.rs`).
//!
//! The lock table itself lives in memory; on start it is rebuilt from the
//! snapshot plus the committed log entries after it (openraft re-applies
//! them). Every write that openraft must be able to rely on after a crash
//! is durable before it is acknowledged: log records are fdatasync'd, and
//! votes and snapshots committed with redb's default
//! `Durability::Immediate`, which fsyncs before `commit` returns.

// openraft's trait methods return its own (large) StorageError; helpers
// that feed them return the same type rather than boxing and unboxing.
#![allow(clippy::result_large_err)]

pub(crate) mod codec;
mod data_dir;
mod disk_space;
mod durable_snapshot;
mod log_file;
mod log_store;
mod overlay;
mod seed;
mod segments;
#[cfg(test)]
mod shared_memory;
mod snapshot_chunks;
mod state_machine;
#[cfg(test)]
mod suite;
pub(crate) mod table_image;
mod verify;
mod witness;

pub use data_dir::{
    check_data_dir, open_data_dir, open_simulated_disk, DataDirError, OpenedData, SimulatedDisk,
    SimulatedDisks,
};
pub use disk_space::DiskSpace;
pub(crate) use log_file::decode_entries;
pub use log_store::{LogStore, StorageIo};
pub use seed::seed_data_dir;
pub use segments::SimulatedSegments;
pub use state_machine::{EventSink, SharedTable, StateMachineStore};
pub use verify::DataReport;

use crate::raft_types::{NodeId, StorageError};
use redb::TableDefinition;

/// Raft log entries by index, bincode-encoded: where formats up to 11 kept
/// the log; read to move it into segments (`log_file.rs`).
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// Small named values: format marker, instance id, vote, purged log id; in
/// the snapshot database, its instance id (and in format 10, the snapshot).
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");

const FORMAT_KEY: &str = "format";
/// Written once into a new data directory and checked at every start. Bump
/// the version when the on-disk encoding changes incompatibly (and
/// [`DATA_FORMAT`] with it).
const FORMAT: &[u8] = b"deadbolt-data/12";
/// The number in [`FORMAT`], as `deadbolt version` reports it.
pub const DATA_FORMAT: u32 = 12;
/// The format whose log was a table of the database: read, and moved into
/// segments when opened for writing.
const FORMAT_LOG_IN_DATABASE: &[u8] = b"deadbolt-data/11";
/// The format whose snapshot database held the snapshot as one value
/// (`snapshot_chunks.rs` says why no longer): read, and cut into chunks
/// (then its log moved) when opened for writing.
const FORMAT_SNAPSHOT_IN_ONE_VALUE: &[u8] = b"deadbolt-data/10";
/// The format before snapshots had a database of their own: read, and
/// moved to this format when opened for writing.
const FORMAT_SNAPSHOT_IN_LOG: &[u8] = b"deadbolt-data/9";
/// The data directory's instance id, the same as its witness's.
const INSTANCE_KEY: &str = "instance";
const VOTE_KEY: &str = "vote";
const PURGED_KEY: &str = "last_purged";
const SNAPSHOT_KEY: &str = "snapshot";

/// What a storage operation was doing, for openraft's error reports.
#[derive(Clone)]
struct At(openraft::ErrorSubject<NodeId>, openraft::ErrorVerb);

/// Turns any redb or encoding error into openraft's `StorageError`, which
/// stops the Raft node: a storage failure is never papered over.
trait OrStorageError<T> {
    fn at(self, at: &At) -> Result<T, StorageError>;
}

impl<T, E: std::error::Error + 'static> OrStorageError<T> for Result<T, E> {
    fn at(self, at: &At) -> Result<T, StorageError> {
        self.map_err(|e| {
            openraft::StorageIOError::new(at.0.clone(), at.1, openraft::AnyError::new(&e)).into()
        })
    }
}

/// Decodes a sealed, bincode-encoded record (see [`codec`]).
fn decode<T: serde::de::DeserializeOwned>(sealed: &[u8], at: &At) -> Result<T, StorageError> {
    bincode::deserialize(codec::unseal(sealed).at(at)?).at(at)
}

/// Encodes a record as bincode behind its checksum (see [`codec`]).
fn encode<T: serde::Serialize>(value: &T, at: &At) -> Result<Vec<u8>, StorageError> {
    Ok(codec::seal(&bincode::serialize(value).at(at)?))
}

/// Reads a sealed, bincode-encoded value from the `META` table.
fn read_meta<T: serde::de::DeserializeOwned>(
    db: &redb::Database,
    key: &str,
    subject: openraft::ErrorSubject<NodeId>,
) -> Result<Option<T>, StorageError> {
    let at = At(subject, openraft::ErrorVerb::Read);
    let txn = db.begin_read().at(&at)?;
    let table = txn.open_table(META).at(&at)?;
    match table.get(key).at(&at)? {
        Some(bytes) => Ok(Some(decode(bytes.value(), &at)?)),
        None => Ok(None),
    }
}

/// Writes a sealed, bincode-encoded value into the `META` table; fsync'd
/// when this returns `Ok` (redb's default `Durability::Immediate`).
fn write_meta<T: serde::Serialize>(
    db: &redb::Database,
    key: &str,
    value: &T,
    subject: openraft::ErrorSubject<NodeId>,
) -> Result<(), StorageError> {
    let at = At(subject, openraft::ErrorVerb::Write);
    let bytes = encode(value, &at)?;
    let txn = db.begin_write().at(&at)?;
    txn.open_table(META)
        .at(&at)?
        .insert(key, bytes.as_slice())
        .at(&at)?;
    txn.commit().at(&at)
}
