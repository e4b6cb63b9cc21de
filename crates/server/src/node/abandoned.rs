//! The acquires whose callers went away, waiting out their grace before
//! `acquire.rs` gives them up: a bounded queue in due order, below the
//! node that holds it and the acquire path that fills and drains it.

use deadbolt_core::SessionId;
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long an abandoned acquire keeps its queue place (or grant). A client
/// whose connection dropped retries within this time (its backoff is capped
/// at 1s) and finds its place, instead of being sent to the back of the queue.
const ABANDON_GRACE: Duration = Duration::from_secs(3);

/// The acquires whose callers went away, each given up once its grace is
/// over, in the order they were dropped: every one gets the same grace, so
/// that is also the order they fall due. One task works through them
/// ([`give_up_abandoned`](super::acquire::give_up_abandoned)) with a bounded number of proposals in flight:
/// 20,000 callers gone at once used to be 20,000 tasks, all proposing in
/// the same instant (abandonments are never refused as overloaded, so they
/// all queued up ahead of everyone else's work).
#[derive(Default)]
pub(crate) struct Abandoned {
    queue: Mutex<VecDeque<Abandonment>>,
    pub(crate) pushed: Notify,
}

/// One acquire whose caller went away, and when to give it up.
pub(crate) struct Abandonment {
    pub(crate) due: Instant,
    pub(crate) session: SessionId,
    pub(crate) lock: String,
    pub(crate) claim: Claim,
}

/// The most abandonments waiting out their grace at once: several times
/// what a node can propose in one grace (about 60,000), and at most about
/// 120 MB with the longest lock names. Past it, a dropped acquire is not
/// given up: its wait stays queued until its session's lease ends, which
/// ends the wait too.
const MAX_ABANDONED: usize = 200_000;

impl Abandoned {
    pub(crate) fn push(&self, session: SessionId, lock: String, claim: Claim) {
        let mut queue = self.queue.lock().expect("abandoned queue poisoned");
        if queue.len() >= MAX_ABANDONED {
            tracing::warn!(
                session = session.0,
                lock,
                "{MAX_ABANDONED} abandoned acquires await their grace already; this one stays queued until its session ends"
            );
            return;
        }
        // Read under the lock, and never before the one ahead (callers on
        // two threads could read the clock in one order and lock in the
        // other): the queue stays in due order, which `take_due` relies
        // on, and a grace can only come out a hair longer, never shorter.
        let earliest = Instant::now() + ABANDON_GRACE;
        let due = queue.back().map_or(earliest, |last| earliest.max(last.due));
        queue.push_back(Abandonment {
            due,
            session,
            lock,
            claim,
        });
        drop(queue);
        self.pushed.notify_one();
    }

    /// Takes the abandonments whose grace is over by `now`, and says when
    /// the next one's will be.
    pub(crate) fn take_due(&self, now: Instant) -> (Vec<Abandonment>, Option<Instant>) {
        let mut queue = self.queue.lock().expect("abandoned queue poisoned");
        let ready = queue.partition_point(|abandonment| abandonment.due <= now);
        let due = queue.drain(..ready).collect();
        (due, queue.front().map(|next| next.due))
    }
}

/// What of an acquire whose caller went away may be given up.
pub(crate) enum Claim {
    /// The queue place, or a grant no later attempt took over.
    Attempt(u64),
    /// Only the queue place.
    QueuePlace,
}
