//! The openraft type configuration: what goes into the Raft log and what
//! comes back from applying it.
//!
//! One log entry carries a *batch* of lock commands. openraft 0.9 writes each
//! `client_write` as its own fsync'd append on the leader, so batching here
//! (see `proposer.rs`) is what lets concurrent requests share one fsync.

use deadbolt_core::{Command, LockError, Outcome};
use serde::{Deserialize, Serialize};
use std::io::Cursor;
use std::sync::Arc;

pub type NodeId = u64;

/// The payload of one Raft log entry: commands applied in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// Shared, not owned: an entry is cloned into the log's cache of recent
    /// entries, out of it to be applied, and once per follower, and a
    /// `Vec` of commands cloned its lock names each time (13 % of the
    /// leader's allocations, 2026-12-05). serde writes an `Arc<[_]>` as
    /// the `Vec` it replaced, so the log, snapshots and the peer protocol
    /// keep their bytes (`batch_encodes_as_before`).
    pub commands: Arc<[Command]>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use deadbolt_core::{SessionId, Token};

    /// The shape `Batch` had when its commands were a `Vec` (0.1.0 wrote
    /// it to logs and sent it to peers).
    #[derive(Serialize, Deserialize)]
    struct BatchOfAVec {
        commands: Vec<Command>,
        at_ms: u64,
    }

    #[test]
    fn batch_encodes_as_before() {
        let commands = vec![
            Command::CloseSession {
                session: SessionId(7),
            },
            Command::Release {
                session: SessionId(7),
                lock: "job".to_owned(),
                token: Token(42),
            },
        ];
        let before = BatchOfAVec {
            commands: commands.clone(),
            at_ms: 1_764_000_000_000,
        };
        let now = Batch {
            commands: commands.into(),
            at_ms: before.at_ms,
        };
        let bytes = bincode::serialize(&before).unwrap();
        assert_eq!(bincode::serialize(&now).unwrap(), bytes);
        assert_eq!(bincode::deserialize::<Batch>(&bytes).unwrap(), now);
    }
}
