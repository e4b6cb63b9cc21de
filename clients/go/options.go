package deadbolt

import "time"

// DefaultTTL is the lease of a session opened without WithTTL.
const DefaultTTL = 30 * time.Second

// LockOption configures a session, or an acquire of a lock, semaphore or
// leadership. WithTTL and WithMargin apply where a session is opened or
// chosen (NewSession; Client's Lock and TryLock, which share one; Client's
// Semaphore and Campaign, which open one of their own); WithOwnSession to
// Client's Lock and TryLock; the others where something is acquired.
type LockOption func(*lockConfig)

type lockConfig struct {
	ttl        time.Duration
	margin     time.Duration // < 0: the default
	mode       string
	lockDelay  time.Duration
	ownSession bool
}

func lockOptions(opts []LockOption) lockConfig {
	cfg := lockConfig{ttl: DefaultTTL, margin: -1}
	for _, opt := range opts {
		opt(&cfg)
	}
	return cfg
}

// WithTTL sets the session's lease (500ms to 24h; default DefaultTTL): how
// long after the last renewal the server acknowledged its locks outlive a
// holder that stopped renewing (crashed, partitioned, paused). The lease is
// renewed every third of it.
func WithTTL(ttl time.Duration) LockOption { return func(c *lockConfig) { c.ttl = ttl } }

// WithMargin sets how long before the lease could end unrenewed the
// session counts it lost: Done is closed and Context cancelled then, so
// that work can stop before the server could grant the lock to anyone
// else. Default: a tenth of the TTL, at most 2s.
func WithMargin(margin time.Duration) LockOption {
	return func(c *lockConfig) {
		if margin >= 0 {
			c.margin = margin
		}
	}
}

// WithOwnSession makes Client.Lock and TryLock take the lock in a session
// of its own, closed when the guard is released, instead of the session
// the client shares between its locks of the same TTL and margin. Its
// loss is then its own (a shared lease that cannot be renewed loses every
// lock held in it at once), for two more round trips a lock: the
// session's open and close.
func WithOwnSession() LockOption { return func(c *lockConfig) { c.ownSession = true } }

// Shared takes a read/write lock shared: beside other readers, in FIFO
// order behind any writer that came first (docs/rw-locks.md).
func Shared() LockOption { return func(c *lockConfig) { c.mode = "shared" } }

// Exclusive takes a read/write lock exclusive: alone, once every holder
// and everyone queued ahead is done. A name taken Shared or Exclusive is a
// read/write lock, and cannot be taken without a mode.
func Exclusive() LockOption { return func(c *lockConfig) { c.mode = "exclusive" } }

// WithLockDelay (0 to 60s) keeps the lock from everyone for that long if
// the session expires while holding it: for resources that cannot check
// fencing tokens (docs/fencing.md).
func WithLockDelay(delay time.Duration) LockOption {
	return func(c *lockConfig) { c.lockDelay = delay }
}

func (c lockConfig) marginFor(ttl time.Duration) time.Duration {
	if c.margin >= 0 {
		return c.margin
	}
	margin := ttl / 10
	if margin > 2*time.Second {
		margin = 2 * time.Second
	}
	return margin
}
