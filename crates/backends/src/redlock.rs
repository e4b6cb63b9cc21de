//! Redlock's arithmetic, as <https://redis.io/docs/latest/develop/use/patterns/distributed-locks/>
//! describes it, for the Redis backend (`redis.rs`), which runs the same
//! `SET NX PX` / compare-and-`PEXPIRE` / compare-and-`DEL` on every node: one
//! node with these rules relaxed is the seeds' single-server lock, N
//! independent masters with them is Redlock.
//!
//! - a grant needs a majority, N/2+1, of the masters;
//! - each master gets a short timeout, so a dead one costs little of the TTL;
//! - the lock is valid for TTL − elapsed − drift, where drift (0.01·TTL +
//!   2 ms) covers the masters' clocks running at different rates; a grant
//!   with no validity left is no grant, and is undone on every master;
//! - a client that failed retries after a random delay.
//!
//! What Redlock does not do (Kleppmann, "How to do distributed locking",
//! 2016): it issues no fencing token, so a client paused past the validity
//! (a GC pause, a VM stall) still writes as if it held the lock; and its
//! safety rests on bounded pauses, network delays and clock drift. A master
//! that restarts without persistence forgets the keys it held, so a second
//! client can gather a majority that counts it; the Redis docs' answer is
//! to keep a restarted master out for one TTL ("delayed restarts"), which
//! this client cannot enforce. `labels.rs` states this wherever the backend
//! is listed.

use std::time::Duration;

/// How a grant over `nodes` servers is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rules {
    pub(crate) nodes: usize,
    /// Grants (and renewals) needed for the lock to count.
    pub(crate) needed: usize,
    /// Redlock's clock-drift allowance (none for one server: the client's
    /// deadline is counted from the send time, and `deadbolt run` keeps its
    /// own drift margin on top).
    redlock: bool,
}

impl Rules {
    /// The seeds' lock on one Redis server.
    pub(crate) const SINGLE: Rules = Rules {
        nodes: 1,
        needed: 1,
        redlock: false,
    };

    pub(crate) fn redlock(nodes: usize) -> Rules {
        Rules {
            nodes,
            needed: nodes / 2 + 1,
            redlock: true,
        }
    }

    /// The clock-drift allowance subtracted from every grant's validity.
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        if self.redlock {
            ttl / 100 + Duration::from_millis(2)
        } else {
            Duration::ZERO
        }
    }

    /// How long the lock holds after a round that took `elapsed`, if at all.
    pub(crate) fn validity(&self, ttl: Duration, elapsed: Duration) -> Option<Duration> {
        ttl.checked_sub(elapsed)
            .and_then(|left| left.checked_sub(self.drift(ttl)))
            .filter(|left| !left.is_zero())
    }

    /// How long one server may take to answer one command. Redlock's is
    /// small next to the TTL (the docs: 5–50 ms for 10 s), so a dead master
    /// costs little validity; one server gets longer, since there is no
    /// other to fall back on.
    pub(crate) fn node_timeout(&self, ttl: Duration) -> Duration {
        if self.redlock {
            (ttl / 200).clamp(Duration::from_millis(5), Duration::from_millis(50))
        } else {
            (ttl / 10).clamp(Duration::from_millis(50), Duration::from_secs(2))
        }
    }

    /// Whether `refusals` servers saying no already rule out a majority.
    pub(crate) fn hopeless(&self, refusals: usize) -> bool {
        refusals > self.nodes - self.needed
    }

    /// Whether an acquire round that `granted` servers granted and
    /// `refused` refused, short of a majority, found the lock held: some
    /// server refused, and either no majority is left to grant or a
    /// majority answered. Otherwise too few servers answered: the lock
    /// system is out of reach. Without "a majority answered", a master dying
    /// while the holder's key lived on it and one other left every round
    /// with one refusal, one grant and one error, which a wait with no
    /// deadline counts as an outage and gives up on after 10 s.
    pub(crate) fn held_elsewhere(&self, granted: usize, refused: usize) -> bool {
        refused > 0 && (self.hopeless(refused) || granted + refused >= self.needed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    #[test]
    fn a_majority_of_masters_is_needed() {
        assert_eq!([3, 4, 5, 7].map(|n| Rules::redlock(n).needed), [2, 3, 3, 4]);
        assert!(!Rules::redlock(5).hopeless(2));
        assert!(Rules::redlock(5).hopeless(3));
        assert!(Rules::SINGLE.hopeless(1));
    }

    #[test]
    fn a_refusal_among_a_majority_of_answers_is_busy_not_an_outage() {
        let three = Rules::redlock(3);
        // One master down, the holder's key on one of the other two.
        assert!(three.held_elsewhere(1, 1));
        assert!(three.held_elsewhere(0, 2));
        // Two masters down: no majority answered, whoever refused.
        assert!(!three.held_elsewhere(0, 1));
        // Nobody refused: granted too slowly, or not reached.
        assert!(!three.held_elsewhere(1, 0));
        assert!(!three.held_elsewhere(0, 0));
        // Four masters, two down, two refusing: no majority (3) can grant.
        assert!(Rules::redlock(4).held_elsewhere(0, 2));
        assert!(Rules::SINGLE.held_elsewhere(0, 1));
    }

    #[test]
    fn validity_is_the_ttl_less_the_time_taken_and_the_drift() {
        let rules = Rules::redlock(5);
        // 10 s TTL: drift 0.01 * 10 s + 2 ms = 102 ms.
        assert_eq!(
            rules.validity(TTL, Duration::from_millis(30)),
            Some(Duration::from_millis(10_000 - 30 - 102))
        );
        assert_eq!(rules.validity(TTL, Duration::from_millis(9_898)), None);
        assert_eq!(rules.validity(TTL, TTL * 2), None);
        assert_eq!(
            Rules::SINGLE.validity(TTL, Duration::from_millis(30)),
            Some(Duration::from_millis(9_970))
        );
    }

    #[test]
    fn per_node_timeouts_are_small_next_to_the_ttl_and_bounded() {
        assert_eq!(
            Rules::redlock(3).node_timeout(TTL),
            Duration::from_millis(50)
        );
        assert_eq!(
            Rules::redlock(3).node_timeout(Duration::from_millis(100)),
            Duration::from_millis(5)
        );
        assert_eq!(
            Rules::SINGLE.node_timeout(Duration::from_secs(3600)),
            Duration::from_secs(2)
        );
    }
}
