//! Bounds on what one request and the whole table may hold.
//!
//! The limits are part of the replicated state machine's behaviour, so they
//! are constants shared by every node, not per-node configuration: two
//! replicas with different limits would diverge on the same log.

use crate::LockError;
use std::time::Duration;

/// The bounds enforced by [`crate::LockTable`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest lock name, in bytes of UTF-8.
    pub max_name_bytes: usize,
    /// Shortest session TTL. Below this a keepalive round trip would eat
    /// most of the lease.
    pub min_ttl: Duration,
    /// Longest session TTL. A crashed holder blocks its locks for this long.
    pub max_ttl: Duration,
    /// Waiters queued on one lock.
    pub max_waiters_per_lock: usize,
    /// Live sessions in the whole table.
    pub max_sessions: usize,
    /// Locks that exist (held or with waiters) in the whole table.
    pub max_locks: usize,
}

impl Limits {
    /// The limits every Deadbolt node runs with.
    pub const STANDARD: Limits = Limits {
        max_name_bytes: 512,
        min_ttl: Duration::from_millis(500),
        max_ttl: Duration::from_secs(24 * 60 * 60),
        max_waiters_per_lock: 10_000,
        max_sessions: 100_000,
        max_locks: 1_000_000,
    };
}

/// Checks a lock name against [`Limits::STANDARD`]: not empty, not too long,
/// no control characters (they make logs and `deadbolt locks` unreadable).
pub fn validate_lock_name(name: &str) -> Result<(), LockError> {
    let limits = Limits::STANDARD;
    if name.is_empty() {
        return Err(LockError::InvalidName {
            reason: "lock name is empty".into(),
        });
    }
    if name.len() > limits.max_name_bytes {
        return Err(LockError::InvalidName {
            reason: format!(
                "lock name is {} bytes, the limit is {}",
                name.len(),
                limits.max_name_bytes
            ),
        });
    }
    if name.chars().any(char::is_control) {
        return Err(LockError::InvalidName {
            reason: "lock name contains control characters".into(),
        });
    }
    Ok(())
}

/// Checks a session TTL against [`Limits::STANDARD`].
pub fn validate_ttl(ttl: Duration) -> Result<(), LockError> {
    let limits = Limits::STANDARD;
    if ttl < limits.min_ttl || ttl > limits.max_ttl {
        return Err(LockError::TtlOutOfRange {
            requested_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            min_ms: limits.min_ttl.as_millis() as u64,
            max_ms: limits.max_ttl.as_millis() as u64,
        });
    }
    Ok(())
}
