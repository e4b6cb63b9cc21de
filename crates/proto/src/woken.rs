//! [`WokenOnly`]: polls one part of a task only when that part was woken.
//!
//! Each end of a `Calls` stream runs one task that waits on two things at
//! once: the server's connection task on its requests and on its calls in
//! flight, the client's on the requests its callers queue and on the
//! server's answers. Woken by one, the task used to poll both, and the
//! other, a socket or a channel with nothing new, answered `Pending` after
//! tokio's readiness check, a lock and a codec run: callgrind counted about
//! two such empty polls per call on each side. Skipping them took 4.6 % off
//! the server's instructions per lock pair and about 3 % off the client's
//! (bench/results/2026-12-06.md). A part wrapped in
//! [`WokenOnly`] is polled with a waker of its own, which marks it and
//! wakes the task, and is polled again only once marked (as
//! `FuturesUnordered` polls only the futures that woke).

use futures::task::{ArcWake, AtomicWaker};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

/// One part of a task, polled only once woken (and at first).
#[derive(Debug)]
pub struct WokenOnly {
    mark: Arc<Mark>,
    /// Wakes `mark`: what the part is polled with.
    waker: Waker,
}

#[derive(Debug)]
struct Mark {
    /// Whether the part may have something new.
    woken: AtomicBool,
    /// The task the part belongs to, as of its last poll.
    task: AtomicWaker,
}

impl ArcWake for Mark {
    fn wake_by_ref(mark: &Arc<Self>) {
        mark.woken.store(true, Ordering::Release);
        mark.task.wake();
    }
}

impl Default for WokenOnly {
    fn default() -> Self {
        Self::new()
    }
}

impl WokenOnly {
    pub fn new() -> Self {
        let mark = Arc::new(Mark {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        WokenOnly {
            waker: futures::task::waker(mark.clone()),
            mark,
        }
    }

    /// `poll` with the part's own waker if the part was woken since it last
    /// answered `Pending`, else `Pending` at once. After `Ready` the part
    /// counts as woken: a stream may have more.
    pub fn poll<T>(
        &self,
        cx: &Context<'_>,
        poll: impl FnOnce(&mut Context<'_>) -> Poll<T>,
    ) -> Poll<T> {
        // First: a wake from now on reaches the task polling now.
        self.mark.task.register(cx.waker());
        // Cleared before the poll, so that a wake during it counts.
        if !self.mark.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        let polled = poll(&mut Context::from_waker(&self.waker));
        if polled.is_ready() {
            self.mark.woken.store(true, Ordering::Release);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::task::noop_waker;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_part_is_polled_again_only_after_its_own_waker_fired() {
        let part = WokenOnly::new();
        let task = noop_waker();
        let cx = Context::from_waker(&task);
        let polls = AtomicUsize::new(0);
        let count = |answer: Poll<()>| {
            part.poll(&cx, |_| {
                polls.fetch_add(1, Ordering::Relaxed);
                answer
            })
        };
        // Polled at first; then, pending and not woken, left alone.
        assert_eq!(count(Poll::Pending), Poll::Pending);
        assert_eq!(count(Poll::Ready(())), Poll::Pending);
        assert_eq!(polls.load(Ordering::Relaxed), 1);
        // Its waker fires: polled once more.
        part.waker.wake_by_ref();
        assert_eq!(count(Poll::Ready(())), Poll::Ready(()));
        // After `Ready` it may have more: polled again.
        assert_eq!(count(Poll::Pending), Poll::Pending);
        assert_eq!(count(Poll::Pending), Poll::Pending);
        assert_eq!(polls.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_wake_during_the_poll_is_not_lost_and_wakes_the_task() {
        struct Counting(AtomicUsize);
        impl ArcWake for Counting {
            fn wake_by_ref(this: &Arc<Self>) {
                this.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let task = Arc::new(Counting(AtomicUsize::new(0)));
        let task_waker = futures::task::waker(task.clone());
        let cx = Context::from_waker(&task_waker);
        let part = WokenOnly::new();
        // The part's waker fires while it is being polled (data arrived
        // just after the read found none).
        let polled = part.poll(&cx, |cx| {
            cx.waker().wake_by_ref();
            Poll::<()>::Pending
        });
        assert_eq!(polled, Poll::Pending);
        assert_eq!(task.0.load(Ordering::Relaxed), 1, "the task was woken");
        let mut again = false;
        let _ = part.poll(&cx, |_| {
            again = true;
            Poll::<()>::Pending
        });
        assert!(again, "the part is polled after a wake during its poll");
    }
}
