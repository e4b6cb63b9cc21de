//! The openraft type configuration: what goes into the Raft log and what
//! comes back from applying it.
//!
//! One log entry carries a *batch* of lock commands. openraft 0.9 writes each
//! `client_write` as its own fsync'd append on the leader, so batching here
//! (see `proposer.rs`) is what lets concurrent requests share one fsync.

use deadbolt_core::{Command, LockError, Outcome};
use serde::{Deserialize, Serialize};
use std::io::Cursor;

pub type NodeId = u64;

/// The payload of one Raft log entry: commands applied in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub commands: Vec<Command>,
    /// The leader's wall clock (Unix ms) when it proposed the batch. It
    /// stamps the audit trail and is the floor of the batch's tokens
    /// (`LockTable::raise_token_floor`): never who holds what, or when a
    /// lease ends (those run on monotonic clocks).
    pub at_ms: u64,
}

/// The outcome of each command of a [`Batch`], in the same order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchOutcome(pub Vec<Result<Outcome, LockError>>);

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Batch,
        R = BatchOutcome,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = crate::runtime::DeadboltRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;
