package deadbolt

// The session Client.Lock and TryLock share between a client's locks of
// the same TTL and margin, opened on first use and closed by its watchdog
// once idle for a renewal interval, as etcd's concurrency.Session is
// shared and as the Python and TypeScript clients do.
//
// Why: a session of its own per lock costs four round trips a lock (open,
// acquire, release, close), each a durable write on the server, and two
// goroutines; in a shared session a lock costs what the work needs, an
// acquire and a release (issue 60). The price is shared fate: if the
// shared lease cannot be renewed, every lock of the client held in it is
// lost at once (each guard's Done is closed, its Context cancelled).
// WithOwnSession keeps a session per lock, for a lock whose loss must be
// its own.
//
// The server tells holders apart by session only, so one session holds a
// name for one caller at a time: a caller whose name is taken in every
// shared session (another caller of this client holds it or waits for it)
// gets a session of its own in the pool, and the two queue on the server
// in FIFO order as any two sessions do.

import (
	"context"
	"errors"
	"sync"
	"time"
)

// sharedKey is what a shared session is chosen by: the TTL asked for and
// the margin.
type sharedKey struct{ ttl, margin time.Duration }

// sharedSessions are a client's shared sessions.
type sharedSessions struct {
	mu       sync.Mutex
	sessions map[sharedKey][]*Session
	// opening holds a token while a shared session is opened, so that a
	// burst of first calls opens one session, not one each.
	opening chan struct{}
}

func newSharedSessions() *sharedSessions {
	return &sharedSessions{sessions: map[sharedKey][]*Session{}, opening: make(chan struct{}, 1)}
}

// take is Lock and TryLock: the lock name in a shared session, or with
// WithOwnSession in one of its own, waiting (wait) or not.
func (c *Client) take(ctx context.Context, name string, opts []LockOption, wait bool) (*Guard, error) {
	if err := checkName("lock", name); err != nil {
		return nil, err
	}
	cfg := lockOptions(opts)
	t := lockTarget(name, cfg)
	if cfg.ownSession {
		return c.owned(ctx, opts, func(s *Session) (*Guard, error) { return s.acquire(ctx, t, wait) })
	}
	for attempt := 1; ; attempt++ {
		s, err := c.sharedSession(ctx, t, cfg, wait)
		if err != nil {
			return nil, err
		}
		g, err := s.acquireClaimed(ctx, t, wait)
		if !errors.Is(err, ErrLost) {
			return g, err
		}
		// The shared lease ended before anything was taken in it for this
		// call (the server forgot the session, or the client counted it
		// lost): that loss takes nothing of this call's with it. No one
		// else is given the session again, and this call tries once more
		// in a fresh one.
		var reason *Error
		if errors.As(err, &reason) {
			s.end(reason)
		}
		if attempt == 2 || ctx.Err() != nil {
			return nil, err
		}
	}
}

// sharedSession is a shared session with t's name claimed in it: the
// first of cfg's TTL and margin whose lease is sound and in which the name
// is free, or a new one. A failed open fails as NewSession does.
func (c *Client) sharedSession(ctx context.Context, t target, cfg lockConfig, wait bool) (*Session, error) {
	key := sharedKey{cfg.ttl, cfg.marginFor(cfg.ttl)}
	pool := c.shared
	if s := pool.claim(key, t.name); s != nil {
		return s, nil
	}
	select {
	case pool.opening <- struct{}{}:
	case <-ctx.Done():
		// Another caller's open outlasted this caller's context.
		_, timed := ctx.Deadline()
		return nil, acquireFailure(ctx, ctx.Err(), t, timed && wait)
	}
	defer func() { <-pool.opening }()
	if s := pool.claim(key, t.name); s != nil {
		return s, nil // another caller opened one meanwhile
	}
	s, err := c.openSession(ctx, cfg, true)
	if err != nil {
		return nil, err
	}
	_ = s.claim(ctx, t.name) // a fresh session: the name is free in it
	pool.mu.Lock()
	defer pool.mu.Unlock()
	pool.sessions[key] = append(pool.sessions[key], s)
	return s, nil
}

// claim is a session of key with name claimed in it, or nil.
func (p *sharedSessions) claim(key sharedKey, name string) *Session {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.sessions[key] {
		if s.claimIfFree(name) {
			return s
		}
	}
	return nil
}

// dropShared takes an ended session out of the pool: it takes no more
// locks.
func (c *Client) dropShared(s *Session) {
	p := c.shared
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, sessions := range p.sessions {
		for i, other := range sessions {
			if other == s {
				rest := append(sessions[:i:i], sessions[i+1:]...)
				if len(rest) == 0 {
					delete(p.sessions, key)
				} else {
					p.sessions[key] = rest
				}
				return
			}
		}
	}
}

// closeShared closes every shared session, which releases every lock
// still held in them.
func (c *Client) closeShared() {
	p := c.shared
	p.mu.Lock()
	var all []*Session
	for _, sessions := range p.sessions {
		all = append(all, sessions...)
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range all {
		wg.Add(1)
		go func(s *Session) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), c.callTimeout)
			defer cancel()
			_ = s.Close(ctx)
		}(s)
	}
	wg.Wait()
}
