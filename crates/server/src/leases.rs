//! Session leases on the leader: keepalives, expiry, and what changes when
//! this node gains or loses leadership.
//!
//! The deadlines themselves live in [`deadbolt_core::LeaseTracker`]; this
//! module owns the clock (tokio's monotonic `Instant`), the task that
//! proposes `ExpireSession` when a deadline passes, and the leadership
//! watcher that (re)starts every session with a full TTL.

use crate::proposer::Proposer;
use crate::raft_types::Raft;
use crate::store::SharedTable;
use crate::waits::Waits;
use deadbolt_core::{Command, DueCheckpoint, LeaseTracker, RenewError, SessionId, SessionLease};
use openraft::ServerState;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// How often the expiry task wakes even without a deadline due. Bounds the
/// delay after a missed notification.
const IDLE_TICK: Duration = Duration::from_millis(250);
/// Pause before retrying an expiry that could not be committed, so a broken
/// Raft log does not turn into a busy loop.
const EXPIRY_RETRY: Duration = Duration::from_millis(500);

#[derive(Default)]
pub struct Leases {
    state: Mutex<LeaseState>,
    /// Wakes the expiry task: a new, possibly earlier, deadline exists.
    changed: Notify,
}

#[derive(Default)]
struct LeaseState {
    /// True once this node leads and has applied everything committed before
    /// its term. Only then may it renew or expire anything.
    leading: bool,
    tracker: LeaseTracker,
}

/// Why a keepalive was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAliveError {
    NotLeader,
    Unknown,
    Expiring,
    /// Commit a `LeaseRenewed` first, then call [`Leases::renewed_through_log`].
    Checkpointed,
}

fn keep_alive_error(err: RenewError) -> KeepAliveError {
    match err {
        RenewError::Unknown => KeepAliveError::Unknown,
        RenewError::Expiring => KeepAliveError::Expiring,
        RenewError::Checkpointed => KeepAliveError::Checkpointed,
    }
}

impl Leases {
    fn state(&self) -> std::sync::MutexGuard<'_, LeaseState> {
        self.state.lock().expect("lease lock poisoned")
    }

    pub fn renew(&self, session: SessionId) -> Result<Duration, KeepAliveError> {
        let mut state = self.state();
        if !state.leading {
            return Err(KeepAliveError::NotLeader);
        }
        state
            .tracker
            .renew(session, Instant::now())
            .map_err(keep_alive_error)
    }

    /// The `LeaseRenewed` that a keepalive for a checkpointed session needed
    /// is committed: renew as usual.
    pub fn renewed_through_log(&self, session: SessionId) -> Result<Duration, KeepAliveError> {
        let mut state = self.state();
        if !state.leading {
            return Err(KeepAliveError::NotLeader);
        }
        state
            .tracker
            .renewed_through_log(session, Instant::now())
            .map_err(keep_alive_error)
    }

    /// A session was opened (applied). Its lease starts now, which is no
    /// earlier than when its opener sees the reply.
    pub fn opened(&self, session: SessionId, ttl: Duration) {
        let mut state = self.state();
        if state.leading {
            state
                .tracker
                .track(session, SessionLease::fresh(ttl), Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    pub fn ended(&self, session: SessionId) {
        self.state().tracker.untrack(session);
    }

    /// This node now leads: every live session gets a full TTL from now
    /// (or the time left at its checkpoint, from now), whatever keepalives an
    /// earlier leader saw. Leases can only get longer.
    fn start_leading(&self, table: &SharedTable) {
        let now = Instant::now();
        let mut state = self.state();
        state.tracker.clear();
        let applied = table.read().expect("state lock poisoned");
        for (session, lease) in applied.table.sessions() {
            state.tracker.track(session, lease, now);
        }
        state.leading = true;
        drop(state);
        self.changed.notify_one();
    }

    fn stop_leading(&self) {
        let mut state = self.state();
        state.leading = false;
        state.tracker.clear();
    }

    pub fn is_leading(&self) -> bool {
        self.state().leading
    }
}

/// Proposes `ExpireSession` for every lease that runs out, and
/// `CheckpointLease` for every session gone quiet, until `stop`.
pub async fn expire_sessions(
    leases: Arc<Leases>,
    proposer: Proposer,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let next = leases
            .state()
            .tracker
            .next_deadline()
            .unwrap_or_else(|| Instant::now() + IDLE_TICK)
            .min(Instant::now() + IDLE_TICK);
        tokio::select! {
            _ = tokio::time::sleep_until(tokio::time::Instant::from_std(next)) => {}
            _ = leases.changed.notified() => {}
            _ = stop.changed() => return,
        }
        let checkpoints = leases.state().tracker.take_due_checkpoints(Instant::now());
        for due in checkpoints {
            tokio::spawn(checkpoint(proposer.clone(), due));
        }
        let expired = leases.state().tracker.take_expired(Instant::now());
        for session in expired {
            let leases = leases.clone();
            let proposer = proposer.clone();
            tokio::spawn(async move {
                match proposer.propose(Command::ExpireSession { session }).await {
                    Ok(_) => tracing::info!(session = session.0, "session expired"),
                    Err(err) => {
                        tracing::warn!(session = session.0, %err, "could not commit expiry; will retry");
                        leases
                            .state()
                            .tracker
                            .retry_expiry(session, Instant::now() + EXPIRY_RETRY);
                    }
                }
            });
        }
    }
}

/// Writes a quiet session's remaining lease to the log. A failure needs no
/// retry: the session stays marked, so its next keepalive goes through the
/// log anyway, and a new leader without the checkpoint gives a full TTL.
async fn checkpoint(proposer: Proposer, due: DueCheckpoint) {
    let command = Command::CheckpointLease {
        session: due.session,
        // Rounded up: a checkpoint may overstate the time left, never understate it.
        remaining_ms: u64::try_from(due.remaining.as_micros().div_ceil(1000)).unwrap_or(u64::MAX),
        renewals: due.renewals,
    };
    if let Err(err) = proposer.propose(command).await {
        tracing::debug!(session = due.session.0, %err, "lease checkpoint not committed");
    }
}

/// Follows openraft's view of who leads and switches lease tracking on and
/// off. Tracking starts only after a linearizable barrier, i.e. once this
/// leader has applied every entry committed before its term (including any
/// expiry an earlier leader proposed).
pub async fn follow_leadership(
    raft: Raft,
    node_id: u64,
    leases: Arc<Leases>,
    waits: Arc<Waits>,
    table: SharedTable,
    mut stop: watch::Receiver<bool>,
) {
    let mut metrics = raft.metrics();
    let mut led_term = None;
    loop {
        let (state, term) = {
            let m = metrics.borrow_and_update();
            (m.state, m.current_term)
        };
        let leading_now = state == ServerState::Leader;
        if leading_now && led_term != Some(term) {
            match raft.ensure_linearizable().await {
                Ok(_) => {
                    leases.start_leading(&table);
                    led_term = Some(term);
                    tracing::info!(
                        node_id,
                        term,
                        "leading: all sessions restarted with a full TTL"
                    );
                }
                Err(err) => {
                    tracing::debug!(%err, "not ready to lead yet");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            }
        } else if !leading_now && led_term.is_some() {
            leases.stop_leading();
            waits.drop_subscribers();
            led_term = None;
            tracing::info!(node_id, ?state, "no longer leading");
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}
