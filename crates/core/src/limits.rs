//! Bounds on what one request and the whole table may hold.
//!
//! The limits are part of the replicated state machine's behaviour, so they
//! are never per-node configuration: two replicas with different limits
//! would diverge on the same log. Most are constants shared by every node
//! ([`Limits::STANDARD`]). The five that size the table ([`TableLimits`]:
//! sessions, locks, waiters per lock, store keys and bytes) are replicated
//! state instead: an admin changes them with [`crate::Command::SetLimits`],
//! which goes through the log like any other change, so every replica
//! switches at the same index, and snapshots carry them. Each has a floor
//! (below it the service stops being useful) and a ceiling (above it one
//! node's memory is no longer bounded by anything we measured:
//! docs/performance.md has 1 M idle sessions at about 850 MB of RSS, 1.2 GB
//! at the peak of a snapshot).

use crate::LockError;
use serde::{Deserialize, Serialize};
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

    /// These limits with the table's configurable ones in place of the
    /// standard values.
    pub fn with(self, table: TableLimits) -> Limits {
        Limits {
            max_waiters_per_lock: table.max_waiters_per_lock,
            max_sessions: table.max_sessions,
            max_locks: table.max_locks,
            max_keys: table.max_keys,
            max_store_bytes: table.max_store_bytes,
            ..self
        }
    }
}

/// The limits an admin may change ([`crate::Command::SetLimits`]), kept in
/// the replicated table. Lowering one below what the table holds takes
/// nothing away: new sessions, locks, waiters or keys are refused until
/// enough have gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableLimits {
    /// Live sessions in the whole table.
    pub max_sessions: usize,
    /// Locks that exist (held or with waiters).
    pub max_locks: usize,
    /// Waiters queued on one lock.
    pub max_waiters_per_lock: usize,
    /// Keys in the fenced store, deleted ones included.
    pub max_keys: usize,
    /// Bytes of keys and values in the fenced store.
    pub max_store_bytes: usize,
}

impl TableLimits {
    /// A new table's limits: [`Limits::STANDARD`]'s.
    pub const DEFAULT: TableLimits = TableLimits {
        max_sessions: Limits::STANDARD.max_sessions,
        max_locks: Limits::STANDARD.max_locks,
        max_waiters_per_lock: Limits::STANDARD.max_waiters_per_lock,
        max_keys: Limits::STANDARD.max_keys,
        max_store_bytes: Limits::STANDARD.max_store_bytes,
    };

    /// The lowest values allowed: enough for a handful of clients, and for
    /// one key with a value of the largest size.
    pub const FLOOR: TableLimits = TableLimits {
        max_sessions: 10,
        max_locks: 10,
        max_waiters_per_lock: 1,
        max_keys: 10,
        max_store_bytes: 1024 * 1024,
    };

    /// The highest values allowed. Memory per entry (measured, release
    /// build, docs/performance.md): about 850 B of RSS per idle session
    /// with its lease (90 B of snapshot), about 550 B per held lock; a
    /// snapshot's copy adds up to half again at its peak. So 2 M sessions
    /// are about 1.7 GB and 5 M locks about 2.8 GB: a few GB at the
    /// ceilings. Raise them only with a new measurement.
    pub const CEILING: TableLimits = TableLimits {
        max_sessions: 2_000_000,
        max_locks: 5_000_000,
        max_waiters_per_lock: 100_000,
        max_keys: 1_000_000,
        max_store_bytes: 1024 * 1024 * 1024,
    };

    /// The limits by name, as the CLI's flags, the API's fields and the
    /// errors spell them.
    pub fn named(&self) -> [(&'static str, usize); 5] {
        [
            ("max_sessions", self.max_sessions),
            ("max_locks", self.max_locks),
            ("max_waiters_per_lock", self.max_waiters_per_lock),
            ("max_keys", self.max_keys),
            ("max_store_bytes", self.max_store_bytes),
        ]
    }

    /// These limits with `change` made, if every value it sets is within
    /// [`FLOOR`](Self::FLOOR) and [`CEILING`](Self::CEILING); else the
    /// first one that is not, and nothing changes.
    pub fn changed(&self, change: &LimitsChange) -> Result<TableLimits, LockError> {
        let mut next = *self;
        let fields = [
            (&mut next.max_sessions, change.max_sessions),
            (&mut next.max_locks, change.max_locks),
            (&mut next.max_waiters_per_lock, change.max_waiters_per_lock),
            (&mut next.max_keys, change.max_keys),
            (&mut next.max_store_bytes, change.max_store_bytes),
        ];
        let bounds = Self::FLOOR.named().into_iter().zip(Self::CEILING.named());
        for ((field, requested), ((name, min), (_, max))) in fields.into_iter().zip(bounds) {
            let Some(requested) = requested else { continue };
            if requested < min as u64 || requested > max as u64 {
                return Err(LockError::LimitOutOfRange {
                    limit: name.to_owned(),
                    requested,
                    min: min as u64,
                    max: max as u64,
                });
            }
            *field = requested as usize;
        }
        Ok(next)
    }

    /// Whether every limit is within its floor and ceiling.
    pub fn in_bounds(&self) -> bool {
        let bounds = Self::FLOOR.named().into_iter().zip(Self::CEILING.named());
        self.named()
            .into_iter()
            .zip(bounds)
            .all(|((_, value), ((_, min), (_, max)))| (min..=max).contains(&value))
    }
}

impl Default for TableLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A change to [`TableLimits`]: the limits to set (`None`: keep).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsChange {
    pub max_sessions: Option<u64>,
    pub max_locks: Option<u64>,
    pub max_waiters_per_lock: Option<u64>,
    pub max_keys: Option<u64>,
    pub max_store_bytes: Option<u64>,
}

impl LimitsChange {
    /// Whether it sets nothing.
    pub fn is_empty(&self) -> bool {
        *self == LimitsChange::default()
    }
}

impl std::fmt::Display for LimitsChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = [
            ("max_sessions", self.max_sessions),
            ("max_locks", self.max_locks),
            ("max_waiters_per_lock", self.max_waiters_per_lock),
            ("max_keys", self.max_keys),
            ("max_store_bytes", self.max_store_bytes),
        ];
        let mut first = true;
        for (name, value) in set {
            if let Some(value) = value {
                let sep = if first { "" } else { " " };
                write!(f, "{sep}{name}={value}")?;
                first = false;
            }
        }
        if first {
            write!(f, "nothing")?;
        }
        Ok(())
    }
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
    if has_control_characters(name) {
        return Err(format!("{what} contains control characters"));
    }
    Ok(())
}

/// Whether `name` has a control character (Unicode's `Cc`: U+0000-U+001F
/// and U+007F-U+009F). Every lock name is checked when it arrives and again
/// when applied; names are nearly always printable ASCII, which one pass
/// over the bytes with no early exit (so the compiler can take them many at
/// a time) tells apart; only a name with a byte outside it is decoded.
fn has_control_characters(name: &str) -> bool {
    let printable_ascii = name.bytes().fold(true, |printable, byte| {
        printable & (b' '..b'\x7f').contains(&byte)
    });
    !printable_ascii && name.chars().any(char::is_control)
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The ASCII shortcut finds exactly the characters Unicode calls
        /// control characters, in ASCII and other names alike.
        #[test]
        fn control_characters_are_found_as_unicode_defines_them(
            name in "[ -~\\x00-\\x1f\\x7f]{0,12}|(\\PC|[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}]){0,12}"
        ) {
            prop_assert_eq!(
                has_control_characters(&name),
                name.chars().any(char::is_control)
            );
        }
    }
}
