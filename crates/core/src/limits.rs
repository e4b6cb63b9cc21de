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
    /// Keys in the fenced store, deleted ones (which keep their fence) included.
    pub max_keys: usize,
    /// Longest value in the fenced store, in bytes of UTF-8.
    pub max_value_bytes: usize,
    /// Bytes of keys and values in the whole fenced store (a deleted key's
    /// name still counts). Without it, `max_keys` values of
    /// `max_value_bytes` would be 6.4 GB, in memory and in every snapshot.
    pub max_store_bytes: usize,
    /// Longest lock-delay: a lock whose holder's session expired stays
    /// unavailable at most this long.
    pub max_lock_delay: Duration,
    /// Audit records kept (the newest), across all locks.
    pub audit_records: usize,
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
        max_keys: 100_000,
        max_value_bytes: 64 * 1024,
        max_store_bytes: 64 * 1024 * 1024,
        max_lock_delay: Duration::from_secs(60),
        audit_records: 10_000,
    };
}

/// Checks a lock name against [`Limits::STANDARD`]: not empty, not too long,
/// no control characters (they make logs and `deadbolt locks` unreadable).
pub fn validate_lock_name(name: &str) -> Result<(), LockError> {
    check_name("lock name", name).map_err(|reason| LockError::InvalidName { reason })
}

/// Checks a fenced-store key by the same rules as a lock name.
pub fn validate_key(key: &str) -> Result<(), LockError> {
    check_name("key", key).map_err(|reason| LockError::InvalidKey { reason })
}

/// Checks a fenced-store value's size against [`Limits::STANDARD`].
pub fn validate_value(value: &str) -> Result<(), LockError> {
    let limit = Limits::STANDARD.max_value_bytes;
    if value.len() > limit {
        return Err(LockError::ValueTooLarge {
            bytes: value.len(),
            limit,
        });
    }
    Ok(())
}

/// Checks a requested lock-delay against [`Limits::STANDARD`].
pub(crate) fn validate_lock_delay(delay_ms: u64) -> Result<(), LockError> {
    let max_ms = Limits::STANDARD.max_lock_delay.as_millis() as u64;
    if delay_ms > max_ms {
        return Err(LockError::LockDelayTooLong {
            requested_ms: delay_ms,
            max_ms,
        });
    }
    Ok(())
}

fn check_name(what: &str, name: &str) -> Result<(), String> {
    let limit = Limits::STANDARD.max_name_bytes;
    if name.is_empty() {
        return Err(format!("{what} is empty"));
    }
    if name.len() > limit {
        return Err(format!(
            "{what} is {} bytes, the limit is {limit}",
            name.len()
        ));
    }
    if name.chars().any(char::is_control) {
        return Err(format!("{what} contains control characters"));
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
