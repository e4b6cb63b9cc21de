//! [`BootInstant`]: the clock lease deadlines are kept on.
//!
//! std's `Instant` (and tokio's timers) use CLOCK_MONOTONIC, which stops
//! while the machine is suspended. The server's clock does not stop for our
//! suspend, so a deadline on CLOCK_MONOTONIC would let a resumed client
//! believe in a lease the server already expired. CLOCK_BOOTTIME keeps
//! counting through suspend. Timers still sleep on tokio's clock; waiters
//! re-check against this one (see `Session::lost`).

use std::ops::Add;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct BootInstant(Duration);

impl BootInstant {
    pub(crate) fn now() -> BootInstant {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `now` is a valid, writable timespec.
        let result = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
        assert_eq!(result, 0, "CLOCK_BOOTTIME is unavailable");
        BootInstant(Duration::new(now.tv_sec as u64, now.tv_nsec as u32))
    }

    pub(crate) fn checked_sub(self, duration: Duration) -> Option<BootInstant> {
        self.0.checked_sub(duration).map(BootInstant)
    }

    pub(crate) fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// The monotonic `Instant` at which this point is reached, unless the
    /// machine suspends in between: for tokio timers and for callers.
    pub(crate) fn to_instant(self) -> Instant {
        let (boot_now, now) = (BootInstant::now(), Instant::now());
        now + self.saturating_duration_since(boot_now)
    }
}

impl Add<Duration> for BootInstant {
    type Output = BootInstant;

    fn add(self, duration: Duration) -> BootInstant {
        BootInstant(self.0 + duration)
    }
}
