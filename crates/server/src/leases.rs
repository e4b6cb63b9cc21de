//! Session leases on the leader: keepalives, expiry, and what changes when
//! this node gains or loses leadership.
//!
//! The deadlines themselves live in [`deadbolt_core::LeaseTracker`]; this
//! module owns the clock (the node's [`Clock`]), the task that
//! proposes `ExpireSession` when a deadline passes (and `CheckpointLease` for
//! quiet sessions, `EndLockDelay` when a lock-delay is over), and the
//! leadership watcher that (re)starts every session with a full TTL.

use crate::clock::Clock;
use crate::proposer::{Proposer, BACKGROUND_PROPOSALS_IN_FLIGHT};
use crate::raft_types::Raft;
use crate::store::SharedTable;
use crate::waits::Waits;
use deadbolt_core::{
    Command, DueCheckpoint, LeaseTracker, RenewError, SessionId, SessionLease, Token,
};
use futures::StreamExt;
use openraft::ServerState;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify};

/// How often the expiry task wakes even without a deadline due. Bounds the
/// delay after a missed notification.
const IDLE_TICK: Duration = Duration::from_millis(250);
/// The resolution of tokio's timers.
const TIMER_TICK: Duration = Duration::from_millis(1);
/// Pause before retrying an expiry that could not be committed, so a broken
/// Raft log does not turn into a busy loop.
const EXPIRY_RETRY: Duration = Duration::from_millis(500);

pub struct Leases {
    clock: Clock,
    state: Mutex<LeaseState>,
    /// Wakes the expiry task: a new, possibly earlier, deadline exists.
    changed: Notify,
}

#[derive(Default)]
struct LeaseState {
    /// The term this node leads, once it has applied everything committed
    /// before that term. Only then may it renew or expire anything, and
    /// what its timers propose carries the term (see
    /// `LockTable::apply_in_term`).
    leading: Option<u64>,
    tracker: LeaseTracker,
    /// Locks in lock-delay: when each delay ends, by this node's clock.
    delays: BTreeSet<(Instant, String, Token)>,
}

impl LeaseState {
    /// Lock-delays whose time has come, removed from the timer.
    fn take_ended_delays(&mut self, now: Instant) -> Vec<(String, Token)> {
        let mut ended = Vec::new();
        while let Some((at, _, _)) = self.delays.first() {
            if *at > now {
                break;
            }
            let (_, lock, token) = self.delays.pop_first().expect("just seen");
            ended.push((lock, token));
        }
        ended
    }
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
    pub fn new(clock: Clock) -> Self {
        Leases {
            clock,
            state: Mutex::default(),
            changed: Notify::new(),
        }
    }

    /// The clock leases run on, whose wall time also ends credentials.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LeaseState> {
        self.state.lock().expect("lease lock poisoned")
    }

    pub fn renew(&self, session: SessionId) -> Result<Duration, KeepAliveError> {
        let mut state = self.state();
        if state.leading.is_none() {
            return Err(KeepAliveError::NotLeader);
        }
        state
            .tracker
            .renew(session, self.clock.now())
            .map_err(keep_alive_error)
    }

    /// The `LeaseRenewed` that a keepalive for a checkpointed session needed
    /// is committed: renew as usual.
    pub fn renewed_through_log(&self, session: SessionId) -> Result<Duration, KeepAliveError> {
        let mut state = self.state();
        if state.leading.is_none() {
            return Err(KeepAliveError::NotLeader);
        }
        state
            .tracker
            .renewed_through_log(session, self.clock.now())
            .map_err(keep_alive_error)
    }

    /// A session was opened (applied). Its lease starts now, which is no
    /// earlier than when its opener sees the reply.
    pub fn opened(&self, session: SessionId, ttl: Duration) {
        let mut state = self.state();
        if state.leading.is_some() {
            state
                .tracker
                .track(session, SessionLease::fresh(ttl), self.clock.now());
            drop(state);
            self.changed.notify_one();
        }
    }

    pub fn ended(&self, session: SessionId) {
        self.state().tracker.untrack(session);
    }

    /// A lock went into lock-delay (applied): it ends `delay` from now,
    /// which is no earlier than from when the session expired.
    pub fn lock_delayed(&self, lock: &str, token: Token, delay: Duration) {
        let mut state = self.state();
        if state.leading.is_some() {
            state
                .delays
                .insert((self.clock.now() + delay, lock.to_owned(), token));
            drop(state);
            self.changed.notify_one();
        }
    }

    /// This node now leads: every live session gets a full TTL from now
    /// (or the time left at its checkpoint, from now), whatever keepalives an
    /// earlier leader saw. Leases can only get longer.
    /// `last_log`: the end of this leader's log when it took over, which
    /// must be applied by now (see `applied_all_before_leading`).
    fn start_leading(&self, term: u64, last_log: Option<u64>, table: &SharedTable) {
        let now = self.clock.now();
        let mut state = self.state();
        state.tracker.clear();
        let applied = table.read().expect("state lock poisoned");
        assert!(
            applied.last_applied.map(|id| id.index) >= last_log,
            "lease tracking must start from the whole log a leader took over"
        );
        for (session, lease) in applied.table.sessions() {
            state.tracker.track(session, lease, now);
        }
        // Like leases, delays start afresh: they may last longer, never less.
        state.delays = applied
            .table
            .delayed_locks()
            .map(|(lock, token, delay)| (now + delay, lock.to_owned(), token))
            .collect();
        state.leading = Some(term);
        drop(state);
        self.changed.notify_one();
    }

    fn stop_leading(&self) {
        let mut state = self.state();
        state.leading = None;
        state.tracker.clear();
        state.delays.clear();
    }

    pub fn is_leading(&self) -> bool {
        self.state().leading.is_some()
    }

    /// The lease time `session` has left by this node's timers; `None`
    /// unless this node leads and tracks it (for the dashboard).
    pub fn remaining(&self, session: SessionId) -> Option<Duration> {
        let state = self.state();
        state.leading?;
        let deadline = state.tracker.deadline(session)?;
        Some(deadline.saturating_duration_since(self.clock.now()))
    }
}

/// Proposes `ExpireSession` for every lease that runs out,
/// `CheckpointLease` for every session gone quiet, and `EndLockDelay` for
/// every lock-delay that is over, until `stop`.
pub async fn expire_sessions(
    leases: Arc<Leases>,
    proposer: Proposer,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let next = {
            let state = leases.state();
            let idle = leases.clock.now() + IDLE_TICK;
            let lease = state.tracker.next_deadline().unwrap_or(idle);
            let delay = state.delays.first().map_or(idle, |(at, _, _)| *at);
            lease.min(delay).min(idle)
        };
        tokio::select! {
            // Biased: the deterministic simulation needs one order.
            biased;
            // A lease ends strictly after its deadline: wake a timer tick
            // later, or a clock that reads exactly the deadline (tokio's
            // paused clock does) would find nothing due and spin.
            _ = leases.clock.sleep_until(next + TIMER_TICK) => {}
            _ = leases.changed.notified() => {}
            _ = stop.changed() => return,
        }
        let now = leases.clock.now();
        let (term, checkpoints, ended_delays, expired) = {
            let mut state = leases.state();
            let Some(term) = state.leading else {
                continue;
            };
            let checkpoints = state.tracker.take_due_checkpoints(now);
            let ended_delays = state.take_ended_delays(now);
            let expired = state.tracker.take_expired(now);
            (term, checkpoints, ended_delays, expired)
        };
        if checkpoints.is_empty() && ended_delays.is_empty() && expired.is_empty() {
            continue;
        }
        let jobs = checkpoints
            .into_iter()
            .map(TimerJob::Checkpoint)
            .chain(
                ended_delays
                    .into_iter()
                    .map(|(lock, token)| TimerJob::EndLockDelay(lock, token)),
            )
            .chain(expired.into_iter().map(TimerJob::Expire));
        let (leases, proposer) = (leases.clone(), proposer.clone());
        let sweep = futures::stream::iter(jobs)
            .for_each_concurrent(BACKGROUND_PROPOSALS_IN_FLIGHT, move |job| {
                job.run(leases.clone(), proposer.clone(), term)
            });
        crate::runtime::spawn(sweep);
    }
}

/// One timer command a sweep found due.
enum TimerJob {
    Checkpoint(DueCheckpoint),
    EndLockDelay(String, Token),
    Expire(SessionId),
}

impl TimerJob {
    async fn run(self, leases: Arc<Leases>, proposer: Proposer, term: u64) {
        match self {
            TimerJob::Checkpoint(due) => checkpoint(proposer, due, term).await,
            TimerJob::EndLockDelay(lock, token) => {
                end_lock_delay(leases, proposer, lock, token, term).await
            }
            TimerJob::Expire(session) => expire(leases, proposer, session, term).await,
        }
    }
}

/// Commits the expiry of a session whose lease ran out in `term`; retried
/// (later) while this node still leads that term.
async fn expire(leases: Arc<Leases>, proposer: Proposer, session: SessionId, term: u64) {
    match proposer
        .propose(Command::ExpireSession { session, term })
        .await
    {
        Ok(Ok(_)) => tracing::info!(session = session.0, "session expired"),
        // Closed meanwhile, or superseded: a later term's leader tracks it.
        Ok(Err(refused)) => tracing::debug!(session = session.0, %refused, "expiry not applied"),
        Err(err) => {
            let mut state = leases.state();
            if state.leading == Some(term) {
                tracing::warn!(session = session.0, %err, "could not commit expiry; will retry");
                let retry_at = leases.clock.now() + EXPIRY_RETRY;
                state.tracker.retry_expiry(session, retry_at);
            }
        }
    }
}

/// Commits the end of a lock-delay that ran out in `term`; retried (later)
/// while this node still leads that term.
async fn end_lock_delay(
    leases: Arc<Leases>,
    proposer: Proposer,
    lock: String,
    token: Token,
    term: u64,
) {
    let command = Command::EndLockDelay {
        lock: lock.clone(),
        token,
        term,
    };
    if let Err(err) = proposer.propose(command).await {
        let mut state = leases.state();
        if state.leading == Some(term) {
            tracing::warn!(lock, %err, "could not end a lock-delay; will retry");
            let retry_at = leases.clock.now() + EXPIRY_RETRY;
            state.delays.insert((retry_at, lock, token));
        }
    }
}

/// Writes a quiet session's remaining lease to the log. A failure needs no
/// retry: the session stays marked, so its next keepalive goes through the
/// log anyway, and a new leader without the checkpoint gives a full TTL.
async fn checkpoint(proposer: Proposer, due: DueCheckpoint, term: u64) {
    let command = Command::CheckpointLease {
        session: due.session,
        // Rounded up: a checkpoint may overstate the time left, never understate it.
        remaining_ms: u64::try_from(due.remaining.as_micros().div_ceil(1000)).unwrap_or(u64::MAX),
        renewals: due.renewals,
        term,
    };
    tracing::debug!(?command, "proposing a lease checkpoint");
    if let Err(err) = proposer.propose(command).await {
        tracing::debug!(session = due.session.0, %err, "lease checkpoint not committed");
    }
}

/// How long a new leader waits for its log to be applied before it checks
/// its leadership again.
const APPLY_WAIT: Duration = Duration::from_secs(1);

/// Resolves once this leader has applied every entry that may have been
/// committed before it led: everything in its log when it became leader
/// (`last_log`; a leader's log holds every committed entry), and whatever a
/// linearizable barrier requires. The barrier alone is not enough: openraft
/// restarts a node that led as leader of the same term, with no election and
/// no new entry, and its barrier then waits only for what the node knew to
/// be committed before it stopped. Found by the simulation: the lease
/// tracking started from a half-replayed log, with a lease checkpoint
/// applied but not the renewal after it, and a lease ended early.
async fn applied_all_before_leading(raft: &Raft, last_log: Option<u64>) -> Result<(), String> {
    raft.ensure_linearizable()
        .await
        .map_err(|err| err.to_string())?;
    raft.wait(Some(APPLY_WAIT))
        .applied_index_at_least(last_log, "the new leader applied its log")
        .await
        .map(drop)
        .map_err(|err| err.to_string())
}

/// Follows openraft's view of who leads and switches lease tracking on and
/// off. Tracking starts only after a linearizable barrier, i.e. once this
/// leader has applied every entry committed before its term (including any
/// expiry an earlier leader proposed); `on_leading` runs right after.
pub async fn follow_leadership(
    raft: Raft,
    node_id: u64,
    leases: Arc<Leases>,
    waits: Arc<Waits>,
    table: SharedTable,
    on_leading: impl Fn(),
    mut stop: watch::Receiver<bool>,
) {
    let mut metrics = raft.metrics();
    let mut led_term = None;
    loop {
        let (state, term, last_log) = {
            let m = metrics.borrow_and_update();
            (m.state, m.current_term, m.last_log_index)
        };
        let leading_now = state == ServerState::Leader;
        if leading_now && led_term != Some(term) {
            if led_term.take().is_some() {
                // Leading again in a later term, the step down in between
                // unseen: nothing of the old term's tracking may carry over.
                leases.stop_leading();
                waits.drop_subscribers();
            }
            match applied_all_before_leading(&raft, last_log).await {
                Ok(()) => {
                    leases.start_leading(term, last_log, &table);
                    on_leading();
                    led_term = Some(term);
                    tracing::info!(
                        node_id,
                        term,
                        "leading: every lease restarted, with a full TTL or what its checkpoint left"
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
            biased;
            changed = metrics.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}
