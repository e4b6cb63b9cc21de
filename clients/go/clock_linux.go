package deadbolt

import (
	"syscall"
	"time"
	"unsafe"
)

const clockBoottime = 7 // CLOCK_BOOTTIME

// boottime reads CLOCK_BOOTTIME. A raw syscall: clock_gettime never
// blocks, so it need not tell the scheduler (4 % of the client's CPU per
// acquire+release pair went to the bookkeeping of a plain one).
func boottime() (time.Duration, bool) {
	var ts syscall.Timespec
	_, _, errno := syscall.RawSyscall(syscall.SYS_CLOCK_GETTIME, clockBoottime, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano()), errno == 0
}

var _, hasBoottime = boottime()

// now is the clock lease deadlines are kept on: CLOCK_BOOTTIME, which keeps
// counting while the machine is suspended (as the server's clock does for
// this machine's suspend), unlike the monotonic clock Go's timers use. A
// client resumed from a suspend then never believes in a lease the server
// already expired.
func now() time.Duration {
	if hasBoottime {
		// It worked once, so it works: the kernel does not take it back.
		if at, ok := boottime(); ok {
			return at
		}
	}
	return monotonicNow()
}
