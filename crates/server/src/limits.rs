//! The table's configurable limits (`deadbolt cluster limits`): read from
//! the applied table, changed through the log.
//!
//! The limits are enforced inside `LockTable::apply`, so they cannot be a
//! per-node flag: two nodes with different limits would apply the same
//! entry differently and diverge. They are replicated state instead
//! (`Command::SetLimits`, `deadbolt_core::TableLimits`): every node switches
//! at the same log index, a restart or a snapshot keeps them, and a node
//! that joins later learns them with the log.

use crate::node::{ApiError, Node};
use deadbolt_core::{LimitsChange, Proposal, TableLimits};
use deadbolt_proto::v1::{self as proto, LimitsResponse, SetLimitsRequest};
use deadbolt_proto::ErrorKind;

impl Node {
    /// The limits in force on this node's applied table, and what the table
    /// holds. Local: any node answers, as with cluster status.
    pub fn limits(&self) -> LimitsResponse {
        let applied = self.table.read().expect("state lock poisoned");
        let table = &applied.table;
        LimitsResponse {
            limits: Some(to_proto(table.table_limits())),
            floor: Some(to_proto(TableLimits::FLOOR)),
            ceiling: Some(to_proto(TableLimits::CEILING)),
            sessions: table.session_count() as u64,
            locks: table.lock_count() as u64,
            keys: table.store().len() as u64,
            store_bytes: table.store().bytes() as u64,
            applied_index: applied.last_applied.map_or(0, |id| id.index),
        }
    }

    /// Sets the limits `change` names, through the log. Checked here first,
    /// so a value out of range costs no log entry (the state machine checks
    /// again: it decides).
    pub async fn set_limits(&self, change: LimitsChange) -> Result<TableLimits, ApiError> {
        if change.is_empty() {
            return Err(ApiError::new(
                ErrorKind::InvalidArgument,
                "no limit to change: set at least one of max_sessions, max_locks, \
                 max_waiters_per_lock, max_keys, max_store_bytes",
            ));
        }
        TableLimits::DEFAULT.changed(&change)?;
        self.propose(Proposal::set_limits(change)).await
    }
}

/// The change a request asks for.
pub(crate) fn change_of(request: &SetLimitsRequest) -> LimitsChange {
    LimitsChange {
        max_sessions: request.max_sessions,
        max_locks: request.max_locks,
        max_waiters_per_lock: request.max_waiters_per_lock,
        max_keys: request.max_keys,
        max_store_bytes: request.max_store_bytes,
    }
}

pub(crate) fn to_proto(limits: TableLimits) -> proto::TableLimits {
    proto::TableLimits {
        max_sessions: limits.max_sessions as u64,
        max_locks: limits.max_locks as u64,
        max_waiters_per_lock: limits.max_waiters_per_lock as u64,
        max_keys: limits.max_keys as u64,
        max_store_bytes: limits.max_store_bytes as u64,
    }
}
