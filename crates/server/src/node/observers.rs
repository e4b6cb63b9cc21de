//! [`Observers`]: what the rest of the node learns from the state machine.
//!
//! Why a module of its own: these are not operations of the node but hooks
//! the store calls (its [`EventSink`]) on its apply path, on every replica
//! and on every replay after a restart, whether or not a request waits, and
//! when a snapshot is built or installed. The events wake blocked acquirers
//! ([`Waits`]), start and stop lease tracking ([`Leases`]), keep the
//! watchers' history ([`History`]) and feed the counters ([`Metrics`]); whatever is added here runs on every apply, so
//! it must stay cheap.

use crate::leases::Leases;
use crate::metrics::Metrics;
use crate::raft_types::BatchOutcome;
use crate::store::EventSink;
use crate::waits::Waits;
use crate::watches::{History, WatchedEntry};
use deadbolt_core::{Event, LockTable};
use std::sync::Arc;
use std::time::Duration;

/// Wakes waiters, tracks leases and counts, as the state machine applies
/// commands.
pub(crate) struct Observers {
    pub waits: Arc<Waits>,
    pub leases: Arc<Leases>,
    pub metrics: Arc<Metrics>,
    pub history: Arc<History>,
}

impl EventSink for Observers {
    fn on_applied(&self, outcomes: &[BatchOutcome], events: &[Event]) {
        self.metrics.applied(outcomes, events);
    }

    fn on_snapshot_built(&self, bytes: usize, took: Duration) {
        self.metrics.snapshot_built(bytes, took);
    }

    fn on_events(&self, events: Vec<Event>, watched: Vec<WatchedEntry>, applied: u64) {
        self.history.applied(watched, applied);
        for event in &events {
            self.waits.on_event(event);
            match event {
                Event::SessionOpened { session, ttl_ms } => {
                    self.leases.opened(*session, Duration::from_millis(*ttl_ms))
                }
                Event::SessionEnded { session, .. } => self.leases.ended(*session),
                Event::LockDelayed {
                    lock,
                    token,
                    delay_ms,
                } => self
                    .leases
                    .lock_delayed(lock, *token, Duration::from_millis(*delay_ms)),
                _ => {}
            }
        }
    }

    fn on_reset(&self, table: &LockTable, applied: u64) {
        self.waits.reset(table);
        self.history.reset(applied);
    }
}
