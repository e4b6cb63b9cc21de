//! The Deadbolt lock state machine: sessions, named exclusive locks and
//! counting semaphores, FIFO wait queues and the fencing-token counter.
//!
//! This crate does no I/O and reads no clock. The replicated part,
//! [`LockTable`], is a deterministic function of the commands applied to it,
//! so every Raft replica that applies the same log reaches the same state and
//! hands out the same tokens. The leader-only part, [`LeaseTracker`], decides
//! *when* a session has expired; the caller passes the monotonic time in.
//!
//! The table also holds a small fenced key-value store ([`FencedStore`]),
//! whose writes are checked against the same tokens.
//!
//! Everything above this crate (Raft, storage, the network) exists to feed
//! commands into a `LockTable` in one agreed order.

mod acl;
mod audit;
mod bounded;
mod command;
mod error;
mod feature_level;
mod fenced;
mod lease;
mod limits;
mod proposal;
mod semaphore;
mod table;
mod watch;

pub use acl::{
    AccessControl, AccessToken, AclCommand, AclError, CredentialEnds, Grant, Permission,
    ROOT_IDENTITY, ROOT_ROLE,
};
pub use audit::{AuditKind, AuditRecord};
pub use command::{AcquireOutcome, Applied, Command, Event, Outcome, SessionEnd};
pub use error::LockError;
pub use feature_level::FeatureLevel;
pub use fenced::{FencedStore, StoredValue};
pub use lease::{DueCheckpoint, LeaseTracker, RenewError};
pub use limits::{
    validate_key, validate_lock_name, validate_ttl, validate_value, Limits, LimitsChange,
    TableLimits,
};
pub use proposal::{Answer, Proposal, WrongOutcome};
pub use semaphore::{
    ElectionInfo, Permit, Rule, RwLockInfo, RwMode, SemaphoreInfo, Semaphores, Want,
    MAX_ELECTION_VALUE, MAX_PERMITS,
};
pub use table::{
    token_floor_ms, LockInfo, LockTable, LockTableV9, SessionInfo, SessionLease, SessionSecret,
    LATEST_TOKEN_FLOOR_MS, TOKENS_AFTER_THE_LATEST_FLOOR,
};
pub use watch::{WatchEvent, WatchKind};

use serde::{Deserialize, Serialize};
use std::fmt;

/// Identifies one client session (a lease). Assigned by the state machine,
/// never reused: the counter behind it only grows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SessionId(pub u64);

/// The SHA-256 of a session's secret. The table keeps only this: the secret
/// itself is known to the client that opened the session and to nobody else
/// (not the log, not snapshots, not other replicas). Hashing and comparing
/// happen in the server, so this crate stays free of randomness and crypto.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SecretHash(pub [u8; 32]);

/// A fencing token. One counter across all locks; every grant takes the next
/// value, so a later grant always carries a larger token than any earlier one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Token(pub u64);

impl Token {
    /// Takes the next token from the counter: the only place a token is
    /// minted, for locks and semaphores alike.
    pub(crate) fn take_next(next_token: &mut u64) -> Token {
        let token = Token(*next_token);
        *next_token = next_token.checked_add(1).expect("token counter overflow");
        token
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
