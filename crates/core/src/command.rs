//! The commands that change a [`crate::LockTable`], and what applying one
//! produces.
//!
//! A `Command` is what goes into the Raft log. Keepalives are deliberately
//! absent: they only move a leader-local deadline (see [`crate::LeaseTracker`]),
//! and writing them to the log would cost an fsync per heartbeat.

use crate::{
    AclCommand, FeatureLevel, LimitsChange, LockError, RwMode, SecretHash, SessionId, StoredValue,
    TableLimits, Token,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One replicated change to the lock table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Start a session with this lease length, owned by whoever knows the
    /// secret that hashes to `secret` (the server drew it and told only the
    /// client that asked).
    OpenSession {
        ttl_ms: u64,
        secret: SecretHash,
        /// The identity that opened it (see [`crate::AccessControl`]):
        /// only that identity may act on the session. `None`: an
        /// anonymous caller, with access control off.
        owner: Option<String>,
    },
    /// The client ended its session: release its locks, drop its waits.
    CloseSession { session: SessionId },
    /// The leader of `term` saw the session's lease run out. Same effect as
    /// a close.
    ExpireSession { session: SessionId, term: u64 },
    /// Take `lock` for `session`. With `wait`, join the FIFO queue if the lock
    /// is held; without, fail with [`LockError::Busy`].
    Acquire {
        session: SessionId,
        lock: String,
        wait: bool,
        /// Identifies this request (a retry gets a new one); 0 for none.
        /// The latest attempt of a session on a lock is remembered, so that
        /// [`Command::Abandon`] can tell whether anyone still wants the grant.
        attempt: u64,
        /// Lock-delay (0: none): if this grant ends because the session
        /// *expired* (not on a release or close), nobody gets the lock for
        /// this long, so writes the lost holder still has in flight can
        /// drain. See [`Command::EndLockDelay`].
        lock_delay_ms: u64,
    },
    /// Give up `lock`, which `session` must hold with `token`.
    Release {
        session: SessionId,
        lock: String,
        token: Token,
    },
    /// Leave the wait queue of `lock` (a blocking acquire timed out). Reports
    /// the grant if it arrived first.
    CancelWait { session: SessionId, lock: String },
    /// The caller of acquire `attempt` went away without an answer. If no
    /// later acquire of this session on `lock` has come since, nobody will
    /// ever learn of the wait or the grant: leave the queue, or release.
    Abandon {
        session: SessionId,
        lock: String,
        attempt: u64,
    },
    /// The leader has had no keepalive from `session` for a while; its lease
    /// had `remaining_ms` left when this was proposed. Until a
    /// [`Command::LeaseRenewed`] follows, a new leader may give the session
    /// just that long instead of a full TTL, so a dead holder's lock is not
    /// kept for up to two TTLs by a leader change. Ignored if the session has
    /// been renewed since the leader read `renewals`.
    CheckpointLease {
        session: SessionId,
        remaining_ms: u64,
        renewals: u64,
        term: u64,
    },
    /// A keepalive came for a checkpointed session: the checkpoint no longer
    /// bounds its lease. Committed before that keepalive is acknowledged.
    LeaseRenewed { session: SessionId },
    /// Set `key` in the fenced store, if `token` is not below its fence
    /// (see [`crate::FencedStore`]). With `lock`, `token` must also be that
    /// lock's current grant.
    StorePut {
        key: String,
        value: String,
        token: Token,
        lock: Option<String>,
    },
    /// Read `key` and raise its fence to `token` (a fenced read).
    StoreRead {
        key: String,
        token: Token,
        lock: Option<String>,
    },
    /// The timer of the leader of `term` for a lock-delay ran out: grant the
    /// lock to the next waiter (if it is still delayed for the grant with
    /// `token`).
    EndLockDelay {
        lock: String,
        token: Token,
        term: u64,
    },
    /// Delete `key`, fenced like a put; the key keeps its fence.
    StoreDelete {
        key: String,
        token: Token,
        lock: Option<String>,
    },
    /// Change who may do what (see [`crate::AccessControl`]).
    Acl(AclCommand),
    /// An admin changes the table's limits (see [`TableLimits`]): all the
    /// values it sets, or none if one is out of range. Last in the enum so
    /// that log entries written before it still decode.
    SetLimits(LimitsChange),
    /// The leader found that every member supports `level`: raise the
    /// cluster version to it (never lower; see [`FeatureLevel`]). Release
    /// 0.1.0 cannot decode this command, so it is itself proposed only
    /// once every member supports [`FeatureLevel::CLUSTER_VERSION`].
    /// Last in the enum, as every new command: log entries written before
    /// it still decode.
    SetClusterVersion { level: FeatureLevel },
    /// Take `count` permits of the semaphore `semaphore` for `session`,
    /// creating it with `capacity` permits if it does not exist (see
    /// `semaphore.rs` for the rules). With `wait`, join its FIFO queue if
    /// they are not free; without, fail with [`LockError::NoPermits`].
    /// `attempt` as for [`Command::Acquire`]; the grant is released,
    /// cancelled and abandoned with the lock commands, by name. Proposed
    /// only at [`FeatureLevel::SEMAPHORES`].
    AcquirePermits {
        session: SessionId,
        semaphore: String,
        capacity: u32,
        count: u32,
        wait: bool,
        attempt: u64,
    },
    /// Take the read/write lock `lock` for `session` in `mode`, creating it
    /// if it does not exist: shared beside other shared holders, exclusive
    /// alone (see `semaphore.rs` for the queue's rules). With `wait`, join
    /// its FIFO queue if it cannot be taken now; without, fail with
    /// [`LockError::RwBusy`]. `attempt` as for [`Command::Acquire`];
    /// released, cancelled and abandoned with the lock commands. Proposed
    /// only at [`FeatureLevel::RW_LOCKS`].
    AcquireRw {
        session: SessionId,
        lock: String,
        mode: RwMode,
        wait: bool,
        attempt: u64,
    },
    /// `session` runs for leader of the election `election` with `value`:
    /// elected at once if it has no leader and no candidate is queued,
    /// else (with `wait`) queued FIFO behind the others, else refused with
    /// [`LockError::HasLeader`]. The leadership is a grant like a lock's:
    /// its token is the term, and resigning is releasing it. Proposed only
    /// at [`FeatureLevel::ELECTIONS`].
    Campaign {
        session: SessionId,
        election: String,
        value: String,
        wait: bool,
        attempt: u64,
    },
    /// The leader of `election` (`session`, elected with `token`) makes
    /// `value` its value. Refused to anyone else, and to an earlier term.
    Proclaim {
        session: SessionId,
        election: String,
        token: Token,
        value: String,
    },
    /// An admin creates the semaphore `semaphore` with `capacity` permits,
    /// kept while nobody holds it, or changes the capacity of the one that
    /// exists (see `semaphore.rs`). Proposed only at
    /// [`FeatureLevel::SEMAPHORES`].
    DefineSemaphore { semaphore: String, capacity: u32 },
    /// An admin drops the definition of `semaphore`: it goes once nobody
    /// holds or waits on it.
    DeleteSemaphore { semaphore: String },
}

impl Command {
    /// The leader term whose timers decided this command, for the commands
    /// that only a leader's timers propose (see [`crate::LockTable::apply_in_term`]).
    pub fn decided_in_term(&self) -> Option<u64> {
        match self {
            Command::ExpireSession { term, .. }
            | Command::CheckpointLease { term, .. }
            | Command::EndLockDelay { term, .. } => Some(*term),
            _ => None,
        }
    }

    /// About how many bytes the command takes in the log: its strings plus
    /// a fixed allowance for the rest. For batching, not for exact sizes.
    pub fn approximate_size(&self) -> usize {
        let strings = match self {
            Command::Acquire { lock, .. }
            | Command::Release { lock, .. }
            | Command::CancelWait { lock, .. }
            | Command::Abandon { lock, .. }
            | Command::EndLockDelay { lock, .. }
            | Command::AcquireRw { lock, .. } => lock.len(),
            Command::AcquirePermits { semaphore, .. }
            | Command::DefineSemaphore { semaphore, .. }
            | Command::DeleteSemaphore { semaphore } => semaphore.len(),
            Command::Campaign {
                election, value, ..
            }
            | Command::Proclaim {
                election, value, ..
            } => election.len() + value.len(),
            Command::StorePut {
                key, value, lock, ..
            } => key.len() + value.len() + lock.as_ref().map_or(0, String::len),
            Command::StoreRead { key, lock, .. } | Command::StoreDelete { key, lock, .. } => {
                key.len() + lock.as_ref().map_or(0, String::len)
            }
            Command::OpenSession { owner, .. } => owner.as_ref().map_or(0, String::len),
            Command::Acl(change) => change.text_bytes(),
            Command::SetLimits(_)
            | Command::SetClusterVersion { .. }
            | Command::CloseSession { .. }
            | Command::ExpireSession { .. }
            | Command::CheckpointLease { .. }
            | Command::LeaseRenewed { .. } => 0,
        };
        strings + 48
    }
}

/// The reply to the command's submitter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    SessionOpened {
        session: SessionId,
        ttl_ms: u64,
    },
    SessionEnded,
    Acquire(AcquireOutcome),
    Released,
    /// `granted` is the token if the lock was granted before the cancel.
    WaitCancelled {
        granted: Option<Token>,
    },
    /// `released` is the token of the grant nobody received, if there was one.
    Abandoned {
        released: Option<Token>,
    },
    /// `current` is false when a renewal overtook the checkpoint.
    LeaseCheckpointed {
        current: bool,
    },
    LeaseRenewed,
    /// `ended`: the lock was in lock-delay for that token and now is not.
    LockDelayEnded {
        ended: bool,
    },
    /// The key now has this fence.
    Stored {
        fence: Token,
    },
    Read(StoredValue),
    /// `existed`: the key had a value before.
    Deleted {
        existed: bool,
    },
    /// The access-control change was made.
    AclChanged,
    /// The table's limits, as they are now.
    LimitsSet(TableLimits),
    /// The cluster version, as it is now.
    ClusterVersionSet(FeatureLevel),
    /// The election's leader now has the proclaimed value.
    Proclaimed,
    /// The semaphore's definition was made (or dropped).
    SemaphoreDefined,
}

/// Where an acquire left the session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AcquireOutcome {
    Granted {
        token: Token,
    },
    /// Waiting; `position` 1 is next in line.
    Queued {
        position: usize,
    },
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionEnd {
    Closed,
    Expired,
}

/// A side effect of applying a command, for anyone watching the table: the
/// server wakes blocked acquirers with these, and (later) the audit trail
/// records them. Listed in the order they happened.
///
/// Names are an `Arc<str>`, shared with the audit record and the watch
/// event made from the same event: a copy of the name in each was three
/// allocations per acquire and per release. serde writes an `Arc<str>` as
/// the `str` it holds, so snapshots (whose audit trail has these names)
/// read and write the same bytes as with a `String`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    Granted {
        lock: Arc<str>,
        session: SessionId,
        token: Token,
    },
    Released {
        lock: Arc<str>,
        session: SessionId,
        token: Token,
    },
    /// A session joined the wait queue of a lock (not emitted when a retried
    /// acquire finds it already queued).
    Queued {
        lock: Arc<str>,
        session: SessionId,
    },
    /// A queued session stopped waiting without being granted.
    WaitEnded {
        lock: Arc<str>,
        session: SessionId,
    },
    SessionOpened {
        session: SessionId,
        ttl_ms: u64,
    },
    SessionEnded {
        session: SessionId,
        how: SessionEnd,
    },
    /// An expired session's grant of `lock` (with `token`) ended, and the
    /// lock stays unavailable for `delay_ms`: the leader times that and then
    /// proposes [`Command::EndLockDelay`].
    LockDelayed {
        lock: Arc<str>,
        token: Token,
        delay_ms: u64,
    },
}

/// Everything applying one command produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    pub outcome: Result<Outcome, LockError>,
    pub events: Vec<Event>,
}
