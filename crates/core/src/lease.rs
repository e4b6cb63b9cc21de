//! [`LeaseTracker`]: the leader's in-memory view of when each session's lease
//! runs out.
//!
//! Keepalives never reach the Raft log; they only push a deadline here. When a
//! deadline passes, the leader proposes `ExpireSession`. Because this state is
//! not replicated, a new leader (or a restarted node) knows nothing of past
//! keepalives and must start every session with a full TTL: a lease may then
//! outlive its TTL, but it never ends early.
//!
//! Checkpoints narrow the gap for sessions that have gone quiet: once a
//! session has sent nothing for half its TTL, the leader writes how much of
//! its lease is left into the log ([`crate::Command::CheckpointLease`]), and a
//! new leader starts it with only that. A keepalive for a checkpointed session
//! must first commit [`crate::Command::LeaseRenewed`], so a checkpoint never
//! understates a lease that a client was told is longer.
//!
//! Time is passed in as [`Instant`]s from a monotonic clock; wall-clock time
//! never decides an expiry.

use crate::{SessionId, SessionLease};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// Deadlines of the sessions this node is expiring as leader.
#[derive(Debug, Default)]
pub struct LeaseTracker {
    /// Ordered, so that checkpoints come out in the same order on every run.
    leases: BTreeMap<SessionId, Lease>,
    /// The same deadlines, ordered, so the next one to pass is the first.
    by_deadline: BTreeSet<(Instant, SessionId)>,
}

#[derive(Debug, Clone, Copy)]
struct Lease {
    ttl: Duration,
    deadline: Instant,
    /// An expiry has been handed out by [`LeaseTracker::take_expired`]; from
    /// then on keepalives are refused, so no client is told its lease was
    /// extended while the expiry is on its way through the log.
    expiring: bool,
    /// The lease time left at the latest checkpoint handed out by
    /// [`LeaseTracker::take_due_checkpoints`] (or found in the log). While
    /// set, renewing needs a [`crate::Command::LeaseRenewed`] in the log
    /// first.
    checkpoint: Option<Duration>,
    /// Renewals through the log so far; stamps checkpoints.
    renewals: u64,
}

/// Checkpoints of a quiet lease come every `TTL / CHECKPOINT_STEPS`.
const CHECKPOINT_STEPS: u32 = 10;

/// A checkpoint the leader should propose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueCheckpoint {
    pub session: SessionId,
    /// Lease time left at the moment the checkpoint was taken.
    pub remaining: Duration,
    pub renewals: u64,
}

/// Why a keepalive was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewError {
    /// Not a session this leader tracks: closed, expired, or never opened.
    Unknown,
    /// The lease already ran out; its expiry is being committed.
    Expiring,
    /// The lease is checkpointed: commit a `LeaseRenewed`, then call
    /// [`LeaseTracker::renewed_through_log`].
    Checkpointed,
}

impl LeaseTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts (or restarts) a session's lease: it ends a full TTL after
    /// `now`, or, if the log holds a checkpoint of it, that much after `now`.
    pub fn track(&mut self, session: SessionId, lease: SessionLease, now: Instant) {
        self.untrack(session);
        let deadline = now + lease.checkpoint.unwrap_or(lease.ttl).min(lease.ttl);
        self.leases.insert(
            session,
            Lease {
                ttl: lease.ttl,
                deadline,
                expiring: false,
                checkpoint: lease.checkpoint,
                renewals: lease.renewals,
            },
        );
        self.by_deadline.insert((deadline, session));
    }

    /// A keepalive arrived at `now`. Returns the TTL granted from `now`.
    pub fn renew(&mut self, session: SessionId, now: Instant) -> Result<Duration, RenewError> {
        let lease = self.leases.get_mut(&session).ok_or(RenewError::Unknown)?;
        if lease.expiring {
            return Err(RenewError::Expiring);
        }
        if lease.checkpoint.is_some() {
            return Err(RenewError::Checkpointed);
        }
        Ok(self.extend(session, now))
    }

    /// A `LeaseRenewed` for `session` was committed: the keepalive that asked
    /// for it renews the lease as usual.
    pub fn renewed_through_log(
        &mut self,
        session: SessionId,
        now: Instant,
    ) -> Result<Duration, RenewError> {
        let lease = self.leases.get_mut(&session).ok_or(RenewError::Unknown)?;
        if lease.expiring {
            return Err(RenewError::Expiring);
        }
        lease.checkpoint = None;
        lease.renewals += 1;
        Ok(self.extend(session, now))
    }

    fn extend(&mut self, session: SessionId, now: Instant) -> Duration {
        let lease = self
            .leases
            .get_mut(&session)
            .expect("checked by the caller");
        // A keepalive handled late (a slow scheduler) still never moves the
        // deadline backwards.
        let deadline = (now + lease.ttl).max(lease.deadline);
        self.by_deadline.remove(&(lease.deadline, session));
        lease.deadline = deadline;
        self.by_deadline.insert((deadline, session));
        lease.ttl
    }

    /// Checkpoints to propose: for sessions silent for at least half their
    /// TTL, and again each time another tenth of the TTL has passed, so a
    /// new leader overstates a dead holder's lease by at most that much.
    pub fn take_due_checkpoints(&mut self, now: Instant) -> Vec<DueCheckpoint> {
        let mut due = Vec::new();
        for (session, lease) in &mut self.leases {
            if lease.expiring {
                continue;
            }
            let remaining = lease.deadline.saturating_duration_since(now);
            let quiet = remaining <= lease.ttl / 2;
            let step = lease.ttl / CHECKPOINT_STEPS;
            if quiet && lease.checkpoint.is_none_or(|last| remaining + step <= last) {
                lease.checkpoint = Some(remaining);
                due.push(DueCheckpoint {
                    session: *session,
                    remaining,
                    renewals: lease.renewals,
                });
            }
        }
        due
    }

    /// Stops tracking a session that was closed or expired.
    pub fn untrack(&mut self, session: SessionId) {
        if let Some(lease) = self.leases.remove(&session) {
            self.by_deadline.remove(&(lease.deadline, session));
        }
    }

    /// Forgets everything: this node stopped being leader.
    pub fn clear(&mut self) {
        self.leases.clear();
        self.by_deadline.clear();
    }

    /// Sessions whose deadline is strictly before `now`, marked as expiring.
    /// Each is returned once (again only after [`retry_expiry`]); keepalives
    /// for them are refused from now on.
    ///
    /// [`retry_expiry`]: Self::retry_expiry
    pub fn take_expired(&mut self, now: Instant) -> Vec<SessionId> {
        let mut expired = Vec::new();
        while let Some(&(deadline, session)) = self.by_deadline.first() {
            if deadline >= now {
                break;
            }
            self.by_deadline.pop_first();
            let lease = self
                .leases
                .get_mut(&session)
                .expect("ordered deadline is tracked");
            lease.expiring = true;
            expired.push(session);
        }
        expired
    }

    /// An expiry handed out by `take_expired` was not seen to commit (no
    /// quorum answered in time): hand it out again at `retry_at`. The
    /// session stays expiring meanwhile, keepalives refused: the first
    /// proposal may still commit, and no client may be told otherwise.
    pub fn retry_expiry(&mut self, session: SessionId, retry_at: Instant) {
        if let Some(lease) = self.leases.get_mut(&session) {
            if lease.expiring {
                self.by_deadline.remove(&(lease.deadline, session));
                lease.deadline = retry_at;
                self.by_deadline.insert((retry_at, session));
            }
        }
    }

    /// When `session`'s lease runs out, if it is tracked (for display).
    pub fn deadline(&self, session: SessionId) -> Option<Instant> {
        self.leases.get(&session).map(|lease| lease.deadline)
    }

    /// The earliest deadline still pending, for sleeping until it.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.by_deadline.first().map(|(deadline, _)| *deadline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn expires_only_after_ttl_from_last_keepalive() {
        let start = Instant::now();
        let mut leases = LeaseTracker::new();
        leases.track(SessionId(1), SessionLease::fresh(TTL), start);
        assert_eq!(
            leases.renew(SessionId(1), start + Duration::from_secs(6)),
            Ok(TTL)
        );
        // The original deadline (start + 10s) has passed, the renewed one has not.
        assert!(leases
            .take_expired(start + Duration::from_secs(15))
            .is_empty());
        assert!(leases
            .take_expired(start + Duration::from_secs(16))
            .is_empty());
        assert_eq!(
            leases.take_expired(start + Duration::from_secs(16) + Duration::from_nanos(1)),
            vec![SessionId(1)]
        );
    }

    #[test]
    fn expiring_session_refuses_keepalives_and_is_returned_once() {
        let start = Instant::now();
        let mut leases = LeaseTracker::new();
        leases.track(SessionId(1), SessionLease::fresh(TTL), start);
        leases.track(SessionId(2), SessionLease::fresh(TTL * 2), start);
        let later = start + TTL + Duration::from_millis(1);
        assert_eq!(leases.take_expired(later), vec![SessionId(1)]);
        assert_eq!(leases.renew(SessionId(1), later), Err(RenewError::Expiring));
        assert!(leases.take_expired(later).is_empty());
        assert_eq!(leases.renew(SessionId(2), later), Ok(TTL * 2));
        leases.untrack(SessionId(1));
        assert_eq!(leases.renew(SessionId(1), later), Err(RenewError::Unknown));
    }

    #[test]
    fn late_keepalive_never_moves_deadline_back() {
        let start = Instant::now();
        let mut leases = LeaseTracker::new();
        leases.track(
            SessionId(1),
            SessionLease::fresh(TTL),
            start + Duration::from_secs(5),
        );
        leases.renew(SessionId(1), start).unwrap();
        assert_eq!(
            leases.next_deadline(),
            Some(start + Duration::from_secs(15))
        );
    }

    #[test]
    fn failed_expiry_is_retried() {
        let start = Instant::now();
        let mut leases = LeaseTracker::new();
        leases.track(SessionId(7), SessionLease::fresh(TTL), start);
        let later = start + TTL * 2;
        assert_eq!(leases.take_expired(later), vec![SessionId(7)]);
        leases.retry_expiry(SessionId(7), later);
        // The first expiry may still commit: no keepalive in between.
        assert_eq!(leases.renew(SessionId(7), later), Err(RenewError::Expiring));
        assert_eq!(
            leases.take_expired(later + Duration::from_millis(1)),
            vec![SessionId(7)]
        );
    }

    #[test]
    fn quiet_sessions_are_checkpointed_in_steps_and_renewed_through_the_log() {
        let start = Instant::now();
        let mut leases = LeaseTracker::new();
        leases.track(SessionId(1), SessionLease::fresh(TTL), start);
        assert!(leases.take_due_checkpoints(start + TTL / 4).is_empty());
        let due = leases.take_due_checkpoints(start + TTL / 2);
        assert_eq!(
            due,
            [DueCheckpoint {
                session: SessionId(1),
                remaining: TTL / 2,
                renewals: 0
            }]
        );
        // Handed out once per step of a tenth of the TTL.
        assert!(leases.take_due_checkpoints(start + TTL / 2).is_empty());
        let again = leases.take_due_checkpoints(start + TTL * 6 / 10);
        assert_eq!(again[0].remaining, TTL * 4 / 10);
        // A keepalive now has to go through the log.
        let now = start + TTL * 7 / 10;
        assert_eq!(
            leases.renew(SessionId(1), now),
            Err(RenewError::Checkpointed)
        );
        assert_eq!(leases.renewed_through_log(SessionId(1), now), Ok(TTL));
        assert_eq!(leases.renew(SessionId(1), now), Ok(TTL));
        let next = leases.take_due_checkpoints(now + TTL / 2);
        assert_eq!(next[0].renewals, 1);
    }

    #[test]
    fn a_checkpoint_from_the_log_starts_a_short_lease() {
        let start = Instant::now();
        let mut leases = LeaseTracker::new();
        let lease = SessionLease {
            ttl: TTL,
            checkpoint: Some(TTL / 5),
            renewals: 3,
        };
        leases.track(SessionId(1), lease, start);
        assert_eq!(leases.next_deadline(), Some(start + TTL / 5));
        assert_eq!(
            leases.renew(SessionId(1), start),
            Err(RenewError::Checkpointed)
        );
    }
}
