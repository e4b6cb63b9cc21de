//go:build !linux

package deadbolt

import "time"

// now is the clock lease deadlines are kept on (the monotonic clock here;
// CLOCK_BOOTTIME on Linux).
func now() time.Duration { return monotonicNow() }
