//! [`Clock`]: the time a node decides leases by, and the wall time that
//! stamps its audit trail.
//!
//! A real node reads the host's monotonic clock (through tokio, so that it
//! is the same clock openraft's timers run on) and its wall clock. The
//! deterministic simulation runs every node on tokio's paused clock and
//! gives each its own rate, to model a node whose clock runs fast or slow
//! within a bound.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// Where this clock and tokio's agree.
    origin: tokio::time::Instant,
    /// This clock's seconds per real second; 1.0 on a real node.
    rate: f64,
    /// `None`: the host's wall clock. `Some(ms)`: the Unix time at `origin`,
    /// advancing with tokio's clock, not at `rate`: a simulated node's
    /// monotonic clock drifts, its wall clock is kept right (as NTP keeps a
    /// real one), so audit stamps show true time.
    unix_ms_at_origin: Option<u64>,
}

impl Clock {
    /// The host's clocks.
    pub fn host() -> Clock {
        Clock {
            origin: tokio::time::Instant::now(),
            rate: 1.0,
            unix_ms_at_origin: None,
        }
    }

    /// A monotonic clock that runs `rate` times as fast as tokio's (which
    /// the simulation controls), and a wall clock that reads `unix_ms` now.
    pub fn simulated(rate: f64, unix_ms: u64) -> Clock {
        assert!(
            rate.is_finite() && rate > 0.0,
            "a clock rate must be positive, got {rate}"
        );
        Clock {
            origin: tokio::time::Instant::now(),
            rate,
            unix_ms_at_origin: Some(unix_ms),
        }
    }

    fn elapsed(&self) -> Duration {
        self.scale(self.origin.elapsed(), self.rate)
    }

    /// Exact (no float rounding) for the host's clock.
    fn scale(&self, duration: Duration, factor: f64) -> Duration {
        if self.rate == 1.0 {
            duration
        } else {
            duration.mul_f64(factor)
        }
    }

    /// Monotonic now, by this clock.
    pub fn now(&self) -> Instant {
        self.origin.into_std() + self.elapsed()
    }

    /// Sleeps until this clock reads `deadline`.
    pub fn sleep_until(&self, deadline: Instant) -> tokio::time::Sleep {
        let ahead = deadline.saturating_duration_since(self.origin.into_std());
        tokio::time::sleep_until(self.origin + self.scale(ahead, 1.0 / self.rate))
    }

    /// Milliseconds since the Unix epoch.
    pub fn unix_ms(&self) -> u64 {
        match self.unix_ms_at_origin {
            Some(at_origin) => at_origin + self.origin.elapsed().as_millis() as u64,
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_millis() as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_fast_clock_reaches_its_deadlines_early_in_real_time() {
        let fast = Clock::simulated(2.0, 1_000);
        let start = tokio::time::Instant::now();
        let deadline = fast.now() + Duration::from_secs(10);
        fast.sleep_until(deadline).await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert!(fast.now() >= deadline);
        assert_eq!(fast.unix_ms(), 6_000, "the wall clock keeps true time");
    }

    #[tokio::test(start_paused = true)]
    async fn the_host_clock_follows_tokio() {
        let host = Clock::host();
        let before = host.now();
        host.sleep_until(before + Duration::from_millis(300)).await;
        assert_eq!(host.now() - before, Duration::from_millis(300));
    }
}
