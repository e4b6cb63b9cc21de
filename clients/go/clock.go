package deadbolt

import "time"

var started = time.Now()

// monotonicNow is time since the process started, on Go's monotonic clock.
func monotonicNow() time.Duration { return time.Since(started) }

// wallDeadline converts an instant of now's clock into a time.Time, for a
// context deadline.
func wallDeadline(at time.Duration) time.Time { return time.Now().Add(at - now()) }
