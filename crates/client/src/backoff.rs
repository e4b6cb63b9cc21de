//! Exponential backoff with full jitter, and the retry loop built on it.
//!
//! Every client of a failed-over or restarting server retries at about the
//! same moment. Full jitter (a delay drawn uniformly from zero up to the
//! exponential ceiling) spreads those retries out instead of letting them
//! arrive in synchronised waves. The same holds for an overloaded leader:
//! its refused callers come back spread over a growing window, not at once.

use crate::Error;
use rand::Rng;
use std::future::Future;
use std::time::{Duration, Instant};

/// First retry ceiling: short, because a leader change usually settles fast.
pub(crate) const BASE: Duration = Duration::from_millis(50);
/// Longest delay between retries of an overloaded call, so recovery is
/// noticed within a second while the refused callers stay spread out.
pub(crate) const CAP: Duration = Duration::from_secs(1);
/// Longest delay between retries while the cluster fails over (`unavailable`,
/// `not_leader`): an election takes 0.2-0.6 s at the default timeouts, so a
/// pause of up to a second after it would make a caller wait for nothing
/// (issue 59: kill-to-grant medians of 1.3-1.8 s). A node that cannot serve
/// answers such a retry at once and cheaply, and the jitter still spreads a
/// dead leader's clients over a quarter of a second.
pub(crate) const FAILOVER_CAP: Duration = Duration::from_millis(250);

/// Delays for successive retries of one operation. Public so that other
/// lock clients built on this crate (`deadbolt-backends`) retry the same way.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            attempt: 0,
        }
    }

    /// The delay before the next retry: uniform in
    /// `[0, min(cap, base * 2^attempt)]`.
    pub fn next_delay(&mut self, rng: &mut impl Rng) -> Duration {
        let ceiling = 2u32
            .checked_pow(self.attempt)
            .and_then(|factor| self.base.checked_mul(factor))
            .map_or(self.cap, |exponential| exponential.min(self.cap));
        self.attempt = self.attempt.saturating_add(1);
        rng.gen_range(Duration::ZERO..=ceiling)
    }
}

/// Runs `request` (on behalf of `session`, for the logs) until it succeeds or fails with an error `retryable`
/// rejects, sleeping a jittered backoff between attempts. With `give_up`, it
/// returns the last error rather than sleep past that instant.
///
/// Attempts themselves are not cut short; callers that must not outlive a
/// deadline race the whole retry against it.
pub(crate) async fn retry<T, Fut>(
    what: &str,
    session: u64,
    give_up: Option<Instant>,
    retryable: impl Fn(&Error) -> bool,
    mut request: impl FnMut() -> Fut,
) -> Result<T, Error>
where
    Fut: Future<Output = Result<T, Error>>,
{
    let mut failover = Backoff::new(BASE, FAILOVER_CAP);
    let mut overload = Backoff::new(BASE, CAP);
    loop {
        let error = match request().await {
            Err(error) if retryable(&error) => error,
            result => return result,
        };
        let backoff = if error.points_elsewhere() {
            &mut failover
        } else {
            &mut overload
        };
        let delay = crate::simulation::with_rng(|mut rng| backoff.next_delay(&mut rng));
        if give_up.is_some_and(|give_up| crate::clock::now() + delay >= give_up) {
            return Err(error);
        }
        tracing::debug!(session, %error, ?delay, "{what} failed; retrying");
        tokio::time::sleep(delay).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn delays_stay_within_the_exponential_ceiling() {
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..100 {
            let mut backoff = Backoff::new(BASE, CAP);
            for attempt in 0..40u32 {
                let ceiling = BASE
                    .checked_mul(2u32.saturating_pow(attempt))
                    .map_or(CAP, |d| d.min(CAP));
                assert!(backoff.next_delay(&mut rng) <= ceiling);
            }
        }
    }

    #[test]
    fn delays_grow_with_attempts() {
        // Averages over many draws, so jitter cannot hide the trend.
        let mut rng = StdRng::seed_from_u64(11);
        let mean_at = |attempt: u32, rng: &mut StdRng| {
            let total: Duration = (0..2000)
                .map(|_| {
                    let mut backoff = Backoff::new(BASE, CAP);
                    backoff.attempt = attempt;
                    backoff.next_delay(rng)
                })
                .sum();
            total / 2000
        };
        let first = mean_at(0, &mut rng);
        let third = mean_at(2, &mut rng);
        assert!(first < Duration::from_millis(30), "{first:?}");
        assert!(third > Duration::from_millis(80), "{third:?}");
    }

    #[test]
    fn delays_are_capped_even_after_many_attempts() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut backoff = Backoff::new(BASE, CAP);
        backoff.attempt = u32::MAX - 1;
        let mut longest = Duration::ZERO;
        for _ in 0..1000 {
            let delay = backoff.next_delay(&mut rng);
            assert!(delay <= CAP);
            longest = longest.max(delay);
        }
        assert!(
            longest > CAP / 2,
            "the cap is the ceiling, not a bound far above it"
        );
        assert_eq!(backoff.attempt, u32::MAX);
    }

    /// An overloaded leader is asked again after jittered delays that grow
    /// to the cap, and the answer comes through once it has room.
    #[tokio::test(start_paused = true)]
    async fn overloaded_is_retried_with_growing_jittered_delays() {
        use crate::ErrorKind;
        use std::sync::atomic::{AtomicU32, Ordering};
        let refusals = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let answer = retry("testing", 1, None, Error::is_transient, || async {
            match refusals.fetch_add(1, Ordering::Relaxed) {
                0..8 => Err(Error::new(
                    ErrorKind::Overloaded,
                    "the leader is overloaded",
                )),
                refused => Ok(refused),
            }
        })
        .await;
        assert_eq!(answer.unwrap(), 8);
        // Ceilings 50, 100, 200, 400, 800 ms, then the 1 s cap three times.
        assert!(
            started.elapsed() <= Duration::from_millis(4550),
            "{:?}",
            started.elapsed()
        );
        // A failover's retries are spaced by at most the failover cap.
        let started = tokio::time::Instant::now();
        let refusals = AtomicU32::new(0);
        let answer = retry("testing", 1, None, Error::is_transient, || async {
            match refusals.fetch_add(1, Ordering::Relaxed) {
                0..8 => Err(Error::new(ErrorKind::NotLeader, "no leader yet")),
                refused => Ok(refused),
            }
        })
        .await;
        assert_eq!(answer.unwrap(), 8);
        // Ceilings 50, 100, 200 ms, then the 250 ms cap five times.
        assert!(
            started.elapsed() <= Duration::from_millis(1600),
            "{:?}",
            started.elapsed()
        );
        // Other refusals are not retried.
        let refused = retry("testing", 1, None, Error::is_transient, || async {
            Err::<(), _>(Error::new(ErrorKind::LimitReached, "full"))
        })
        .await;
        assert_eq!(refused.unwrap_err().kind(), ErrorKind::LimitReached);
    }
}
