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
        if let Some(simulated) = crate::simulation::boot_time() {
            return BootInstant(simulated);
        }
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

    /// The monotonic `Instant` at which this point is reached, unless the
    /// machine suspends in between: for tokio timers and for callers. A
    /// point already passed stays in the past (by as much as it has passed),
    /// so that a lease deadline read after it never looks like "now": the
    /// nemesis's double-grant count caught a client paused past its lease
    /// whose `lease_deadline()` said the lease lasted until it woke.
    pub(crate) fn to_instant(self) -> Instant {
        let (boot_now, now) = (BootInstant::now(), now());
        match self.0.checked_sub(boot_now.0) {
            Some(ahead) => now + ahead,
            None => now.checked_sub(boot_now.0 - self.0).unwrap_or(now),
        }
    }
}

/// Now on the monotonic clock, as tokio reads it: the same as
/// `Instant::now()`, except in a simulation, where tokio's clock is paused
/// and moves only when every task waits.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

impl Add<Duration> for BootInstant {
    type Output = BootInstant;

    fn add(self, duration: Duration) -> BootInstant {
        BootInstant(self.0 + duration)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passed_point_stays_in_the_past() {
        let second = Duration::from_secs(1);
        let passed = BootInstant::now().checked_sub(second).unwrap();
        assert!(passed.to_instant() + second / 2 < Instant::now());
        let ahead = BootInstant::now() + second;
        assert!(ahead.to_instant() > Instant::now() + second / 2);
    }
}
