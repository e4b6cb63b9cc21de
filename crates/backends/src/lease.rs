//! [`Lease`]: what a client knows about a lease it renews, shared by the
//! Redis, Redlock, etcd and PostgreSQL backends (Deadbolt's own client keeps
//! its own, on CLOCK_BOOTTIME), and [`watchdog`], the loop that renews it.
//!
//! The deadline is counted from when a successful renewal was *sent*: the
//! server counts from when it received it, which is later, so the client's
//! deadline is never later than the server's (clock-rate drift aside, which
//! callers cover with the margin they give [`Lease::lost`]). Everything that
//! must stop when the lease is lost watches it through a `watch` channel and
//! re-arms when a renewal moves the deadline.
//!
//! These deadlines are on the monotonic clock, which stops while the machine
//! is suspended: a resumed laptop may believe in a lease the server already
//! ended. That is one more reason the non-Deadbolt backends are labelled as
//! they are (see `labels.rs`).

use crate::Error;
use deadbolt_client::Backoff;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
// tokio's clock, so the tests below can run on paused time.
use tokio::time::Instant;

/// Why a lock (or the lease under it) is, or must be presumed, gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lost {
    /// The lease ran out (or came within the caller's margin of running
    /// out) without a renewal moving its deadline.
    Expired,
    /// The server said the lock or the lease is no longer ours.
    Rejected(String),
    /// Released or closed by this process.
    Closed,
}

impl fmt::Display for Lost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Lost::Expired => f.write_str("the lease could not be renewed in time"),
            Lost::Rejected(why) => write!(f, "the lock service ended the lease: {why}"),
            Lost::Closed => f.write_str("the lock was released"),
        }
    }
}

impl From<deadbolt_client::LeaseLost> for Lost {
    fn from(lost: deadbolt_client::LeaseLost) -> Self {
        match lost {
            deadbolt_client::LeaseLost::Expired => Lost::Expired,
            deadbolt_client::LeaseLost::Rejected(error) => Lost::Rejected(error.to_string()),
            deadbolt_client::LeaseLost::Closed => Lost::Closed,
        }
    }
}

#[derive(Debug)]
struct State {
    deadline: Instant,
    ended: Option<Lost>,
}

/// A lease's deadline and, once it is over, why. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Lease(Arc<watch::Sender<State>>);

impl Lease {
    pub(crate) fn new(deadline: Instant) -> Self {
        Lease(Arc::new(
            watch::channel(State {
                deadline,
                ended: None,
            })
            .0,
        ))
    }

    /// Moves the deadline to `deadline`; never back (a late answer to an
    /// older renewal must not shorten what a newer one granted).
    pub(crate) fn renewed(&self, deadline: Instant) {
        self.0.send_if_modified(|state| {
            let later = state.ended.is_none() && deadline > state.deadline;
            if later {
                state.deadline = deadline;
            }
            later
        });
    }

    /// Ends the lease; the first reason sticks.
    pub(crate) fn end(&self, reason: Lost) {
        self.0.send_if_modified(|state| {
            let open = state.ended.is_none();
            if open {
                state.ended = Some(reason);
            }
            open
        });
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.0.borrow().deadline
    }

    pub(crate) fn is_lost(&self) -> bool {
        let state = self.0.borrow();
        state.ended.is_some() || Instant::now() >= state.deadline
    }

    /// Completes once the lease is lost, or is within `margin` of its
    /// deadline with no renewal having moved it.
    pub(crate) fn lost(&self, margin: Duration) -> impl Future<Output = Lost> + Send + 'static {
        let mut state = self.0.subscribe();
        async move {
            loop {
                let alarm = {
                    let current = state.borrow_and_update();
                    if let Some(reason) = &current.ended {
                        return reason.clone();
                    }
                    match current.deadline.checked_sub(margin) {
                        Some(alarm) => alarm,
                        None => return Lost::Expired,
                    }
                };
                tokio::select! {
                    () = tokio::time::sleep_until(alarm) => {
                        // A renewal that landed as the alarm went off counts.
                        if !state.has_changed().unwrap_or(false) {
                            return Lost::Expired;
                        }
                    }
                    changed = state.changed() => {
                        if changed.is_err() {
                            return Lost::Closed;
                        }
                    }
                }
            }
        }
    }
}

/// What one renewal attempt found.
pub(crate) enum Renewal {
    /// Renewed: the lease now lasts until this instant.
    Until(Instant),
    /// The server says the lease is gone; no retry can bring it back.
    Gone(String),
}

/// Retry delays of a failed renewal: short, since a third of the TTL is all
/// the time there is.
const RENEW_BASE: Duration = Duration::from_millis(20);
const RENEW_CAP: Duration = Duration::from_millis(500);

/// Renews `lease` every `interval` (a third of the TTL) with `renew` until
/// the server disowns it or its deadline passes unrenewed, then ends it.
/// Failed attempts are retried with backoff and full jitter while the lease
/// lasts; each attempt is cut off after `interval`, so a hung one cannot
/// outlive it. Stops at once when the lease is ended by someone else.
pub(crate) async fn watchdog<F, Fut>(lease: Lease, interval: Duration, mut renew: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Renewal, Error>>,
{
    let mut ended = lease.0.subscribe();
    let mut next = Instant::now() + interval;
    let reason = loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            _ = ended.wait_for(|state| state.ended.is_some()) => return,
        }
        let mut backoff = Backoff::new(RENEW_BASE, RENEW_CAP);
        let outcome = loop {
            let deadline = lease.deadline();
            let attempt = tokio::time::timeout(interval, renew()).await;
            let error = match attempt {
                Ok(Ok(renewal)) => break Some(renewal),
                Ok(Err(error)) => error.to_string(),
                Err(_) => format!("no answer within {interval:?}"),
            };
            let delay = backoff.next_delay(&mut rand::thread_rng());
            if Instant::now() + delay >= deadline {
                tracing::warn!(%error, "lease lost: could not renew it in time");
                break None;
            }
            tracing::debug!(%error, ?delay, "renewal failed; retrying");
            tokio::time::sleep(delay).await;
        };
        match outcome {
            Some(Renewal::Until(deadline)) => {
                lease.renewed(deadline);
                next = Instant::now() + interval;
            }
            Some(Renewal::Gone(why)) => {
                tracing::warn!(%why, "lease lost: the server ended it");
                break Lost::Rejected(why);
            }
            None => break Lost::Expired,
        }
    };
    lease.end(reason);
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(9);

    #[tokio::test(start_paused = true)]
    async fn lost_fires_a_margin_before_the_deadline_and_renewals_push_it_back() {
        let start = Instant::now();
        let lease = Lease::new(start + TTL);
        let lost = tokio::spawn(lease.lost(Duration::from_secs(1)));
        tokio::time::sleep(Duration::from_secs(5)).await;
        lease.renewed(start + 2 * TTL);
        // An older answer cannot shorten it again.
        lease.renewed(start + TTL);
        assert_eq!(lost.await.unwrap(), Lost::Expired);
        assert_eq!(Instant::now() - start, 2 * TTL - Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_ends_the_lease_when_the_server_disowns_it() {
        let lease = Lease::new(Instant::now() + TTL);
        let mut renewals = 0;
        watchdog(lease.clone(), TTL / 3, || {
            renewals += 1;
            let answer = if renewals < 3 {
                Renewal::Until(Instant::now() + TTL)
            } else {
                Renewal::Gone("the key is someone else's".into())
            };
            async move { Ok(answer) }
        })
        .await;
        assert_eq!(
            lease.lost(Duration::ZERO).await,
            Lost::Rejected("the key is someone else's".into())
        );
        assert_eq!(renewals, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_gives_up_at_the_deadline_when_renewals_keep_failing() {
        let start = Instant::now();
        let lease = Lease::new(start + TTL);
        watchdog(lease.clone(), TTL / 3, || async {
            Err(Error::unavailable("redis://x:1", "connection refused"))
        })
        .await;
        assert_eq!(lease.lost(Duration::ZERO).await, Lost::Expired);
        assert!(Instant::now() <= start + TTL, "gave up past the deadline");
    }
}
