//! [`LeaseTracker`]: the leader's in-memory view of when each session's lease
//! runs out.
//!
//! Keepalives never reach the Raft log; they only push a deadline here. When a
//! deadline passes, the leader proposes `ExpireSession`. Because this state is
//! not replicated, a new leader (or a restarted node) knows nothing of past
//! keepalives and must start every session with a full TTL: a lease may then
//! outlive its TTL, but it never ends early.
//!
//! Time is passed in as [`Instant`]s from a monotonic clock; wall-clock time
//! never decides an expiry.

use crate::SessionId;
use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Deadlines of the sessions this node is expiring as leader.
#[derive(Debug, Default)]
pub struct LeaseTracker {
    leases: HashMap<SessionId, Lease>,
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
}

/// Why a keepalive was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewError {
    /// Not a session this leader tracks: closed, expired, or never opened.
    Unknown,
    /// The lease already ran out; its expiry is being committed.
    Expiring,
}

impl LeaseTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts (or restarts) a session's lease: it ends `ttl` after `now`.
    pub fn track(&mut self, session: SessionId, ttl: Duration, now: Instant) {
        self.untrack(session);
        let deadline = now + ttl;
        self.leases.insert(
            session,
            Lease {
                ttl,
                deadline,
                expiring: false,
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
        // A keepalive handled late (a slow scheduler) still never moves the
        // deadline backwards.
        let deadline = (now + lease.ttl).max(lease.deadline);
        self.by_deadline.remove(&(lease.deadline, session));
        lease.deadline = deadline;
        self.by_deadline.insert((deadline, session));
        Ok(lease.ttl)
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
    /// Each is returned once; keepalives for them are refused from now on.
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
            debug_assert!(!lease.expiring);
            lease.expiring = true;
            expired.push(session);
        }
        expired
    }

    /// An expiry handed out by `take_expired` could not be committed (say,
    /// leadership was lost mid-way): try again at `retry_at`.
    pub fn retry_expiry(&mut self, session: SessionId, retry_at: Instant) {
        if let Some(lease) = self.leases.get_mut(&session) {
            if lease.expiring {
                lease.expiring = false;
                lease.deadline = retry_at;
                self.by_deadline.insert((retry_at, session));
            }
        }
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
        leases.track(SessionId(1), TTL, start);
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
        leases.track(SessionId(1), TTL, start);
        leases.track(SessionId(2), TTL * 2, start);
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
        leases.track(SessionId(1), TTL, start + Duration::from_secs(5));
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
        leases.track(SessionId(7), TTL, start);
        let later = start + TTL * 2;
        assert_eq!(leases.take_expired(later), vec![SessionId(7)]);
        leases.retry_expiry(SessionId(7), later);
        assert_eq!(
            leases.take_expired(later + Duration::from_millis(1)),
            vec![SessionId(7)]
        );
    }
}
