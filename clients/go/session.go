package deadbolt

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SessionHandle is a session's id and secret: together, what it takes to
// act on the session. The id is public (status shows it); the secret is
// not. String gives the CLI's "ID.SECRET" form.
type SessionHandle struct {
	ID     uint64
	Secret string
}

// String is the handle as the CLI prints and takes it: "ID.SECRET".
func (h SessionHandle) String() string { return strconv.FormatUint(h.ID, 10) + "." + h.Secret }

// ParseSessionHandle reads an "ID.SECRET" handle (DEADBOLT_SESSION).
func ParseSessionHandle(text string) (SessionHandle, error) {
	number, secret, found := strings.Cut(text, ".")
	id, err := strconv.ParseUint(number, 10, 64)
	if !found || err != nil || secret == "" {
		return SessionHandle{}, newError(KindInvalidArgument, "%q is not a session handle (ID.SECRET)", text)
	}
	return SessionHandle{id, secret}, nil
}

type handleBody struct {
	SessionID     uint64 `json:"session_id"`
	SessionSecret string `json:"session_secret"`
}

func (h SessionHandle) body() handleBody { return handleBody{h.ID, h.Secret} }

// Session is a lease on the server: every lock taken in it lasts only as
// long as the lease, which a goroutine renews every third of the TTL.
//
// The server counts a lease from when it receives a keepalive; the client
// only knows when it sent one. Counting from the send gives a deadline
// never later than the server's, so while the session trusts its lease,
// the server keeps it (clock-rate drift aside, which the margin covers).
// Done is closed a margin before that deadline if no renewal moved it on.
//
// A Session is safe for concurrent use; one lock name is held by one
// caller of a session at a time.
type Session struct {
	client *Client
	handle SessionHandle
	ttl    time.Duration
	margin time.Duration

	// shared: one of the sessions Client.Lock and TryLock share
	// (shared.go), which its watchdog closes once a renewal interval
	// passed with no lock held or taken in it, so that an idle client
	// keeps no session alive on the server.
	shared bool

	mu       sync.Mutex
	deadline time.Duration // on now()'s clock
	ended    *Error
	changed  chan struct{} // closed (and replaced) on every change
	inUse    map[string]struct{}
	cleaning map[string]chan struct{}
	// usedLately: a name was claimed since the watchdog last looked.
	usedLately bool

	ctx    context.Context
	cancel context.CancelFunc
}

// NewSession opens a session (WithTTL, WithMargin). Close it when done:
// that releases everything it holds at once; otherwise its locks are held
// until the lease runs out.
func (c *Client) NewSession(ctx context.Context, opts ...LockOption) (*Session, error) {
	return c.openSession(ctx, lockOptions(opts), false)
}

func (c *Client) openSession(ctx context.Context, cfg lockConfig, shared bool) (*Session, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	sent := now()
	var answer struct {
		SessionID     uint64 `json:"session_id"`
		TTLMs         uint64 `json:"ttl_ms"`
		SessionSecret string `json:"session_secret"`
	}
	open := post("/v1/session/open", struct {
		TTLMs uint64 `json:"ttl_ms"`
	}{millis(cfg.ttl)})
	// Repeated through outages like every call: a repeat after an attempt
	// that did get through opens a second session, which holds nothing
	// and expires after its TTL.
	policy := retryPolicy{idempotentChange: true}
	err := c.retrying(ctx, policy, func(ctx context.Context) error { return c.send(ctx, open, &answer) })
	if err != nil {
		return nil, err
	}
	if answer.SessionID == 0 || answer.SessionSecret == "" {
		return nil, newError(KindInternal, "the server opened a session without an id or a secret")
	}
	ttl := time.Duration(answer.TTLMs) * time.Millisecond
	if ttl <= 0 {
		ttl = cfg.ttl
	}
	s := &Session{
		client:   c,
		shared:   shared,
		handle:   SessionHandle{answer.SessionID, answer.SessionSecret},
		ttl:      ttl,
		margin:   cfg.marginFor(ttl),
		deadline: sent + ttl,
		changed:  make(chan struct{}),
		inUse:    map[string]struct{}{},
		cleaning: map[string]chan struct{}{},
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.watchdog(sent)
	go s.alarm()
	return s, nil
}

// ID is the server's id of the session (public: status shows it).
func (s *Session) ID() uint64 { return s.handle.ID }

// Handle is the session's id and secret: keep it as private as the locks.
func (s *Session) Handle() SessionHandle { return s.handle }

// TTL is the lease the server granted.
func (s *Session) TTL() time.Duration { return s.ttl }

// Margin is how long before the lease could end Done is closed.
func (s *Session) Margin() time.Duration { return s.margin }

// Deadline is the latest instant the lease is certain to last until, as
// this client knows it.
func (s *Session) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return wallDeadline(s.deadline)
}

// Done is closed once the lease can no longer be trusted: within the
// margin of its end with no renewal moving it, ended by the server, or
// closed. From then on another client may be granted the session's locks.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Context is cancelled when Done is closed: pass it (or a guard's) to the
// work the locks protect, and it stops when they can no longer be trusted.
func (s *Session) Context() context.Context { return s.ctx }

// Err is nil while the lease can be trusted with the margin, and then why
// not: an error matching ErrLost (and ErrSessionClosed after Close).
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reason := s.lostReason(s.margin); reason != nil {
		return reason
	}
	return nil
}

// WaitLost blocks until the lease is lost, or within margin of running out
// with no renewal moving it, and returns why (an error matching ErrLost);
// or ctx's error if ctx ends first.
func (s *Session) WaitLost(ctx context.Context, margin time.Duration) error {
	for {
		s.mu.Lock()
		reason := s.lostReason(margin)
		wake := s.deadline - margin - now()
		changed := s.changed
		s.mu.Unlock()
		if reason != nil {
			return reason
		}
		// Now and then even before then: a suspend delays timers, not
		// the lease.
		if wake > time.Second {
			wake = time.Second
		}
		timer := time.NewTimer(wake)
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-changed:
			timer.Stop()
		case <-timer.C:
		}
	}
}

// lostReason: why the lease cannot be trusted margin ahead, or nil. Called
// with mu held.
func (s *Session) lostReason(margin time.Duration) *Error {
	if s.ended != nil {
		return s.ended
	}
	if now() >= s.deadline-margin {
		return s.expired(nil)
	}
	return nil
}

// leaseError is why the lease is gone (with no margin), for the retries of
// calls that depend on it.
func (s *Session) leaseError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reason := s.lostReason(0); reason != nil {
		return reason
	}
	return nil
}

func (s *Session) expired(cause error) *Error {
	because := ""
	if cause != nil {
		because = fmt.Sprintf(" (%v)", cause)
	}
	return &Error{
		Kind:    KindSessionExpiring,
		Message: fmt.Sprintf("session %d lost its lease: it could not be renewed in time%s", s.handle.ID, because),
		cause:   cause,
		expired: true,
	}
}

// notify wakes everyone waiting for a change. Called with mu held.
func (s *Session) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// end ends the lease for reason unless it has ended already; whether this
// call ended it.
func (s *Session) end(reason *Error) bool { return s.endIf(reason, false) }

// endIf is end; with onlyIfIdle, only if no name is claimed or being
// cleaned up in the session and none was claimed since the last look.
// Checked and ended under one hold of mu: a name claimed meanwhile
// (claimIfFree) keeps the session open.
func (s *Session) endIf(reason *Error, onlyIfIdle bool) bool {
	s.mu.Lock()
	first := s.ended == nil
	if onlyIfIdle {
		first = first && len(s.inUse) == 0 && len(s.cleaning) == 0 && !s.usedLately
		s.usedLately = false
	}
	if first {
		s.ended = reason
		s.notify()
	}
	s.mu.Unlock()
	if first {
		s.cancel()
		if s.shared {
			s.client.dropShared(s)
		}
	}
	return first
}

func sleepOr(changed <-chan struct{}, d time.Duration) {
	if d > time.Second {
		d = time.Second
	}
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	select {
	case <-changed:
		timer.Stop()
	case <-timer.C:
	}
}

// watchdog renews the lease every third of the TTL, from when the last
// renewal was sent, until the session ends.
func (s *Session) watchdog(lastSent time.Duration) {
	interval := s.ttl / 3
	for {
		s.mu.Lock()
		for s.ended == nil && now() < lastSent+interval {
			wait, changed := lastSent+interval-now(), s.changed
			s.mu.Unlock()
			sleepOr(changed, wait)
			s.mu.Lock()
		}
		if s.ended != nil {
			s.mu.Unlock()
			return
		}
		deadline := s.deadline
		s.mu.Unlock()
		if s.shared && s.endIf(s.closedError(), true) {
			s.closeQuietly(context.Background(), interval)
			return
		}
		sent := now()
		granted, err := s.renew(deadline, interval)
		if err != nil {
			if endsSession(err) {
				var failure *Error
				errors.As(err, &failure)
				s.end(failure)
			} else {
				s.end(s.expired(err))
				s.closeQuietly(context.Background(), interval)
			}
			return
		}
		s.mu.Lock()
		// An answer that arrives once the lease is within the margin of
		// its end cannot revive it: the client has counted it lost (Done
		// closed, work stopped, Err said why), and a lease renewed behind
		// its back would keep the locks from everyone while nobody uses
		// them, and make Err nil again after Done.
		renewed := s.lostReason(s.margin) == nil
		if renewed {
			if next := sent + granted; next > s.deadline {
				s.deadline = next
			}
			s.notify()
		}
		s.mu.Unlock()
		if !renewed {
			s.end(s.expired(nil))
			s.closeQuietly(context.Background(), interval)
			return
		}
		lastSent = sent
	}
}

// renew sends keepalives, repeated while the lease lasts unless the server
// disowns the session; an attempt that hangs is given up after interval.
// The TTL granted to the one that got through.
func (s *Session) renew(deadline, interval time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithDeadline(context.Background(), wallDeadline(deadline))
	defer cancel()
	var answer struct {
		TTLMs uint64 `json:"ttl_ms"`
	}
	keepAlive := post("/v1/session/keepalive", s.handle.body())
	policy := retryPolicy{retryable: func(err error) bool { return !endsSession(err) }}
	err := s.client.retrying(ctx, policy, func(ctx context.Context) error {
		attempt, cancel := context.WithTimeout(ctx, interval)
		defer cancel()
		return s.client.send(attempt, keepAlive, &answer)
	})
	return time.Duration(answer.TTLMs) * time.Millisecond, err
}

// alarm cancels the session's context when the lease comes within the
// margin of its end.
func (s *Session) alarm() {
	for {
		s.mu.Lock()
		reason := s.lostReason(s.margin)
		wait, changed := s.deadline-s.margin-now(), s.changed
		s.mu.Unlock()
		if reason != nil {
			s.cancel()
			return
		}
		sleepOr(changed, wait)
	}
}

// Close stops renewing and ends the session on the server, which releases
// everything it holds. If the server cannot be told (within ctx, or the
// lease), the lease ends by itself.
//
// Closing a session Client.Lock and TryLock share (Guard.Session) releases
// every lock of the client held in it.
func (s *Session) Close(ctx context.Context) error {
	if !s.end(s.closedError()) {
		return nil
	}
	s.mu.Lock()
	within := s.deadline - now()
	s.mu.Unlock()
	if within < time.Second {
		within = time.Second
	}
	return s.closeQuietly(ctx, within)
}

func (s *Session) closedError() *Error {
	return &Error{
		Kind:    KindUnknownSession,
		Message: fmt.Sprintf("session %d is closed", s.handle.ID),
		closed:  true,
	}
}

func (s *Session) closeQuietly(ctx context.Context, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	closeSession := post("/v1/session/close", s.handle.body())
	err := s.client.retrying(ctx, retryPolicy{}, func(ctx context.Context) error {
		return s.client.send(ctx, closeSession, nil)
	})
	if endsSession(err) {
		return nil // gone already: after an attempt that got through, or expired
	}
	return err
}

// KeepAlive renews someone's session by its handle, once (no retries),
// and returns the TTL granted. A Session renews itself; this is for a
// process that was handed a session (DEADBOLT_SESSION of `deadbolt run`).
func (c *Client) KeepAlive(ctx context.Context, handle SessionHandle) (time.Duration, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	var answer struct {
		TTLMs uint64 `json:"ttl_ms"`
	}
	r := post("/v1/session/keepalive", handle.body())
	r.idempotent = false
	err := c.send(ctx, r, &answer)
	return time.Duration(answer.TTLMs) * time.Millisecond, err
}

// ---- claims -----------------------------------------------------------

// claim marks name used by one caller of the session: the server knows
// only the session, so two callers taking one lock through one session
// would both be told they hold it. A name whose abandoned acquire is being
// cleaned up is waited for.
func (s *Session) claim(ctx context.Context, name string) error {
	for {
		s.mu.Lock()
		cleaning := s.cleaning[name]
		if cleaning == nil {
			if _, used := s.inUse[name]; used {
				s.mu.Unlock()
				return newError(KindInvalidArgument, "%q is already held or being acquired through session %d: use one session per holder", name, s.handle.ID)
			}
			s.inUse[name] = struct{}{}
			s.usedLately = true
			s.mu.Unlock()
			return nil
		}
		s.mu.Unlock()
		select {
		case <-cleaning:
		case <-ctx.Done():
			return newError(KindWaitCancelled, "gave up waiting for %q: %v", name, ctx.Err())
		}
	}
}

// claimIfFree claims name for one caller, as claim does, if the lease can
// be trusted and no caller has name or is cleaning it up; whether it did.
// For the shared sessions, where a caller looks for one to use.
func (s *Session) claimIfFree(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The context too: once cancelled (the alarm fired) it stays so, even
	// if a late renewal moved the lease on, and a guard made from it would
	// be born lost.
	if s.lostReason(s.margin) != nil || s.ctx.Err() != nil {
		return false
	}
	if _, used := s.inUse[name]; used || s.cleaning[name] != nil {
		return false
	}
	s.inUse[name] = struct{}{}
	s.usedLately = true
	return true
}

func (s *Session) forget(name string) {
	s.mu.Lock()
	delete(s.inUse, name)
	s.mu.Unlock()
}
