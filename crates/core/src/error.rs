//! Why a command was refused. Every refusal leaves the table unchanged.

use crate::{AclError, FeatureLevel, RwMode, SessionId, Token};
use serde::{Deserialize, Serialize};

/// A command the state machine refused. Refusals are deterministic: every
/// replica refuses the same command for the same reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum LockError {
    #[error("unknown session {0} (it was closed or expired, or never existed)")]
    UnknownSession(SessionId),
    #[error("{}", busy_text(lock, *holder_token, *lock_delay))]
    Busy {
        lock: String,
        holder_token: Token,
        /// The holder's session expired and the lock is in its lock-delay.
        lock_delay: bool,
    },
    #[error("not holder: session {session} does not hold lock {lock:?}")]
    NotHolder { lock: String, session: SessionId },
    #[error("stale token: lock {lock:?} is held with token {current}, not {presented}")]
    StaleToken {
        lock: String,
        presented: Token,
        current: Token,
    },
    #[error("invalid lock name: {reason}")]
    InvalidName { reason: String },
    #[error(
        "ttl {} is out of range: must be between {} and {}",
        duration_text(*requested_ms),
        duration_text(*min_ms),
        duration_text(*max_ms)
    )]
    TtlOutOfRange {
        requested_ms: u64,
        min_ms: u64,
        max_ms: u64,
    },
    #[error("lock {lock:?} already has {limit} waiters")]
    TooManyWaiters { lock: String, limit: usize },
    #[error("the server already has {limit} sessions")]
    TooManySessions { limit: usize },
    #[error("the server already has {limit} locks")]
    TooManyLocks { limit: usize },
    #[error(
        "stale fencing token {presented} for key {key:?}: it has already accepted token {fence}"
    )]
    StaleFence {
        key: String,
        presented: Token,
        fence: Token,
    },
    #[error("stale fencing token {presented}: lock {lock:?} is {}", match current { Some(t) => format!("held with token {t}"), None => "not held".to_owned() })]
    NotCurrentGrant {
        lock: String,
        presented: Token,
        current: Option<Token>,
    },
    #[error("fencing token {presented} has not been issued yet (the next grant gets {next})")]
    TokenNotIssued { presented: Token, next: Token },
    #[error(
        "lock-delay {} is too long: at most {}",
        duration_text(*requested_ms),
        duration_text(*max_ms)
    )]
    LockDelayTooLong { requested_ms: u64, max_ms: u64 },
    #[error("invalid store key: {reason}")]
    InvalidKey { reason: String },
    #[error("value is {bytes} bytes, the limit is {limit}")]
    ValueTooLarge { bytes: usize, limit: usize },
    #[error("the store already has {limit} keys")]
    TooManyKeys { limit: usize },
    #[error(transparent)]
    Acl(#[from] AclError),
    #[error("decided by the leader of term {decided} but committed in term {committed}: ignored")]
    Superseded { decided: u64, committed: u64 },
    #[error(
        "the store would hold {bytes} bytes of keys and values, the limit is {limit}: delete \
         values no longer needed, or keep large data elsewhere and store a reference"
    )]
    StoreFull { bytes: usize, limit: usize },
    #[error("{limit} {requested} is out of range: must be between {min} and {max}")]
    LimitOutOfRange {
        limit: String,
        requested: u64,
        min: u64,
        max: u64,
    },
    #[error(
        "semaphore {semaphore:?} does not exist: name its permits to create it, or have an \
         admin define it (`deadbolt semaphore define`)"
    )]
    NoSuchSemaphore { semaphore: String },
    #[error(
        "semaphore {semaphore:?} was not defined by an admin: its first acquirer made it, and it \
         goes with its last permit; there is no definition to delete"
    )]
    NotDefined { semaphore: String },
    #[error(
        "semaphore {semaphore:?}: {count} of {capacity} permits is not a valid request: the \
         capacity must be between 1 and {max}, and the count between 1 and the capacity"
    )]
    InvalidPermits {
        semaphore: String,
        capacity: u32,
        count: u32,
        max: u32,
    },
    #[error(
        "semaphore {semaphore:?} has {capacity} permits, not {requested}: every acquirer must \
         name the same number, or none to take what it has (an admin changes it with `deadbolt \
         semaphore define`; an undefined one changes once nobody holds or waits on it)"
    )]
    CapacityMismatch {
        semaphore: String,
        capacity: u32,
        requested: u32,
    },
    #[error(
        "semaphore {semaphore:?} cannot grant {asked} permits now: {free} free, {queued} \
         requests queued ahead"
    )]
    NoPermits {
        semaphore: String,
        free: u32,
        queued: usize,
        asked: u32,
    },
    #[error("{name:?} is a {kind}, not a {asked}: one name is one kind")]
    WrongKind {
        name: String,
        kind: String,
        asked: String,
    },
    #[error(
        "{feature} need cluster version {needed}, and the cluster is at {current}: every \
         member must run a release that supports it (see `deadbolt cluster status` and \
         docs/upgrading.md)"
    )]
    NeedsClusterVersion {
        feature: String,
        needed: FeatureLevel,
        current: FeatureLevel,
    },
    #[error(
        "read/write lock {lock:?} cannot be taken {asked} now: {}, {queued} requests queued \
         ahead", match (exclusive, holders) { (true, _) => "held exclusive".to_owned(), (false, n) => format!("held shared by {n}") }
    )]
    RwBusy {
        lock: String,
        asked: RwMode,
        exclusive: bool,
        holders: usize,
        queued: usize,
    },
    #[error(
        "session {session} already holds or waits for read/write lock {lock:?} {has}, not \
         {asked}: release it first (a hold never changes its mode in place: two shared \
         holders upgrading at once would wait for each other forever)"
    )]
    OtherMode {
        lock: String,
        session: SessionId,
        has: RwMode,
        asked: RwMode,
    },
    #[error(
        "election {election:?} has a leader (term {term}), and {queued} candidates are \
         queued ahead"
    )]
    HasLeader {
        election: String,
        term: Token,
        queued: usize,
    },
}

fn busy_text(lock: &str, holder_token: Token, lock_delay: bool) -> String {
    if lock_delay {
        format!(
            "lock {lock:?} is in lock-delay: the session holding it (token {holder_token}) \
             expired, and nobody may take it until the delay is over"
        )
    } else {
        format!("lock {lock:?} is held by another session (token {holder_token})")
    }
}

/// Milliseconds as the CLI's duration flags take them (`500ms`, `30s`,
/// `5m`, `24h`), in the largest unit that says it exactly.
fn duration_text(ms: u64) -> String {
    for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000)] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_they_are_typed() {
        let refused = LockError::TtlOutOfRange {
            requested_ms: 90_000_000,
            min_ms: 500,
            max_ms: 86_400_000,
        };
        assert_eq!(
            refused.to_string(),
            "ttl 25h is out of range: must be between 500ms and 24h"
        );
        assert_eq!(duration_text(0), "0ms");
        assert_eq!(duration_text(1_500), "1500ms");
        assert_eq!(duration_text(61_000), "61s");
        assert_eq!(duration_text(60_000), "1m");
    }
}
