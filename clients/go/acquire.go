package deadbolt

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// target is what an acquire takes, and how it is released and looked for:
// a lock (in a read/write mode or none), permits of a semaphore, or
// leadership of an election. The server keeps every name to one kind.
type target struct {
	kind      string // "lock", "semaphore" or "election"
	name      string
	mode      string
	capacity  uint32
	count     uint32
	value     string
	lockDelay time.Duration
}

type acquireBody struct {
	SessionID     uint64  `json:"session_id"`
	SessionSecret string  `json:"session_secret"`
	Lock          string  `json:"lock,omitempty"`
	Mode          string  `json:"mode,omitempty"`
	LockDelayMs   uint64  `json:"lock_delay_ms,omitempty"`
	Semaphore     string  `json:"semaphore,omitempty"`
	Capacity      uint32  `json:"capacity,omitempty"`
	Count         uint32  `json:"count,omitempty"`
	Election      string  `json:"election,omitempty"`
	Value         string  `json:"value,omitempty"`
	Wait          bool    `json:"wait"`
	TimeoutMs     *uint64 `json:"timeout_ms,omitempty"`
	Attempt       uint64  `json:"attempt,omitempty"`
}

type grantAnswer struct {
	Token   uint64   `json:"token"`
	Term    uint64   `json:"term"`
	Permits []Permit `json:"permits"`
}

// Permit is one permit of a semaphore: its own fencing token, and its slot
// (0 to capacity-1; no two live permits share a slot).
type Permit struct {
	Token uint64 `json:"token"`
	Slot  uint32 `json:"slot"`
}

func (t target) body(h SessionHandle) acquireBody {
	b := acquireBody{SessionID: h.ID, SessionSecret: h.Secret}
	switch t.kind {
	case "semaphore":
		b.Semaphore, b.Capacity, b.Count = t.name, t.capacity, t.count
	case "election":
		b.Election, b.Value = t.name, t.value
	default:
		b.Lock, b.Mode, b.LockDelayMs = t.name, t.mode, millis(t.lockDelay)
	}
	return b
}

func (t target) acquirePath() string {
	switch t.kind {
	case "semaphore":
		return "/v1/semaphore/acquire"
	case "election":
		return "/v1/election/campaign"
	}
	return "/v1/lock/acquire"
}

func (t target) releasePath() string {
	switch t.kind {
	case "semaphore":
		return "/v1/semaphore/release"
	case "election":
		return "/v1/election/resign"
	}
	return "/v1/lock/release"
}

func (t target) what() string {
	if t.kind == "lock" && t.mode != "" {
		return "read/write lock"
	}
	return t.kind
}

var lastAttempt uint64

// nextAttempt is a fresh acquire attempt id: microseconds of wall-clock
// time, strictly increasing within the process. Every send gets a new one,
// retries included: the server gives back a grant whose caller went away
// unless a later attempt of the same session took over.
func nextAttempt() uint64 {
	for {
		last := atomic.LoadUint64(&lastAttempt)
		next := uint64(time.Now().UnixMicro())
		if next <= last {
			next = last + 1
		}
		if atomic.CompareAndSwapUint64(&lastAttempt, last, next) {
			return next
		}
	}
}

// requestContext is the context of one acquire request, ending at
// deadline. A waiting acquire's is not its caller's: the server is told to
// wait only until the caller's deadline and answers wait_timeout then, so
// the request outlives that deadline a little; it ends at once only when
// the caller cancels.
func requestContext(caller context.Context, wait bool, deadline time.Time) (context.Context, context.CancelFunc) {
	if !wait {
		return context.WithDeadline(caller, deadline)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	if caller.Done() == nil {
		return ctx, cancel // a caller that can never cancel: no watcher needed
	}
	stop := make(chan struct{})
	go func() {
		select {
		case <-caller.Done():
			if !errors.Is(caller.Err(), context.DeadlineExceeded) {
				cancel()
			}
		case <-stop:
		}
	}()
	return ctx, func() { close(stop); cancel() }
}

// acquire takes t in this session, waiting (wait) in its FIFO queue until
// granted or until ctx ends.
func (s *Session) acquire(ctx context.Context, t target, wait bool) (*Guard, error) {
	if err := s.claim(ctx, t.name); err != nil {
		return nil, err
	}
	return s.acquireClaimed(ctx, t, wait)
}

// acquireClaimed is acquire once t's name is claimed in the session.
// Repeated while the server is unreachable or changing leader, for as long
// as the lease lasts: an acquire by the same session is idempotent, and
// each repeat asks the server to wait only for what is left of ctx's
// deadline.
func (s *Session) acquireClaimed(ctx context.Context, t target, wait bool) (*Guard, error) {
	waitUntil, timed := ctx.Deadline()
	body := t.body(s.handle)
	body.Wait = wait
	path := t.acquirePath()
	var answer grantAnswer
	var attempt uint64
	send := func(ctx context.Context) error {
		attempt = nextAttempt()
		body.Attempt = attempt
		until := time.Now().Add(s.client.callTimeout)
		if wait {
			until = time.Time{}
			if timed {
				left := millis(time.Until(waitUntil))
				body.TimeoutMs = &left
				until = waitUntil.Add(s.client.callTimeout)
			}
		}
		// No longer than the lease lasts: a server that stops answering
		// must not hold the caller past it. The wait is sent again (a
		// fresh attempt keeps the queue place) while the lease holds.
		if lease := s.Deadline(); until.IsZero() || lease.Before(until) {
			until = lease
		}
		rctx, cancel := requestContext(ctx, wait, until)
		defer cancel()
		answer = grantAnswer{}
		return s.client.send(rctx, post(path, body), &answer)
	}
	policy := retryPolicy{lost: s.leaseError}
	switch {
	case timed && wait:
		// Retried until the deadline, as the wait itself is: what is
		// left goes to the server as timeout_ms.
		policy.giveUp = waitUntil
	case !timed && !wait:
		policy.giveUp = time.Now().Add(s.client.callTimeout)
	}
	retryCtx := ctx
	if wait && timed {
		// The caller's deadline is the server's to keep (wait_timeout);
		// only a cancel stops the retries early.
		var cancel context.CancelFunc
		retryCtx, cancel = requestContext(ctx, true, waitUntil.Add(s.client.callTimeout))
		defer cancel()
	}
	err := s.client.retrying(retryCtx, policy, send)
	if err != nil {
		if ctx.Err() != nil || (transient(err) && !HadNoEffect(err)) {
			// Cut off mid-call: the server may have queued or granted it.
			left := s.cleanUpAbandoned(t, attempt)
			if ctx.Err() == nil {
				// The client gave up, not the caller: the queue place is
				// given back before the timeout is reported, so that what
				// the caller (or anyone) reads next no longer shows it
				// (found by the conformance suite's wait_timeout, whose
				// status read came before the asynchronous give-back).
				select {
				case <-left:
				case <-time.After(s.client.callTimeout):
				}
			}
		} else {
			s.forget(t.name)
		}
		return nil, acquireFailure(ctx, err, t, timed && wait)
	}
	token := answer.Token
	if t.kind == "election" {
		token = answer.Term
	}
	if token == 0 && len(answer.Permits) > 0 {
		token = answer.Permits[0].Token
	}
	// Every grant has a token above zero: an answer without one is not a
	// grant, and must not be read as one.
	if token == 0 {
		s.forget(t.name)
		return nil, newError(KindInternal, "the server answered an acquire of %s %q without a token", t.what(), t.name)
	}
	// An answer that arrives as the lease ends cannot be relied on.
	if lost := s.leaseError(); lost != nil {
		s.forget(t.name)
		return nil, lost
	}
	return newGuard(s, t, token, answer.Permits), nil
}

// acquireFailure is what a failed acquire returns: with a deadline,
// transient errors are retried until it (nearly) runs out, so to the
// caller that is a timeout, not an outage; a cancelled context gives a
// wait_cancelled error that wraps context.Canceled.
func acquireFailure(ctx context.Context, err error, t target, timed bool) error {
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(ctxErr, context.DeadlineExceeded) && !endsSession(err) {
		return &Error{
			Kind:    KindWaitCancelled,
			Message: fmt.Sprintf("gave up acquiring %s %q: %v", t.what(), t.name, ctxErr),
			cause:   ctxErr,
		}
	}
	if (timed || errors.Is(ctx.Err(), context.DeadlineExceeded)) && (transient(err) || ErrorKind(err) == "") {
		return &Error{
			Kind:    KindWaitTimeout,
			Message: fmt.Sprintf("timed out acquiring %s %q (last error: %v)", t.what(), t.name, err),
			cause:   err,
		}
	}
	return err
}

// cleanUpAbandoned gives back what an acquire cut off mid-call may have
// left on the server: a queue place, or a grant answered as its caller
// left. The server gives both back by itself after a grace of 3s (the
// attempt id tells it whether a later acquire took over); this does it
// now. It repeats the acquire with the same attempt and a timeout of zero,
// which leaves the queue at once, or answers the grant, which is then
// released. A grant answered after that (into a connection the server had
// not yet seen closed) is looked for a moment later.
//
// It returns a channel closed once the queue place has been given back (or
// there was nothing to give back), before the later look for a grant.
func (s *Session) cleanUpAbandoned(t target, attempt uint64) <-chan struct{} {
	done := make(chan struct{})
	left := make(chan struct{})
	var leftOnce sync.Once
	markLeft := func() { leftOnce.Do(func() { close(left) }) }
	s.mu.Lock()
	// The name stays claimed until the clean-up is over; a new caller of
	// it waits for that (see claim).
	delete(s.inUse, t.name)
	s.cleaning[t.name] = done
	s.mu.Unlock()
	go func() {
		defer func() {
			markLeft()
			s.mu.Lock()
			delete(s.cleaning, t.name)
			s.mu.Unlock()
			close(done)
		}()
		if attempt == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.client.callTimeout)
		defer cancel()
		body := t.body(s.handle)
		body.Wait, body.Attempt = true, attempt
		zero := uint64(0)
		body.TimeoutMs = &zero
		var answer grantAnswer
		err := s.client.retrying(ctx, retryPolicy{lost: s.leaseError}, func(ctx context.Context) error {
			return s.client.send(ctx, post(t.acquirePath(), body), &answer)
		})
		token := answer.Token
		if t.kind == "election" {
			token = answer.Term
		}
		if err == nil && token != 0 {
			_ = s.releaseToken(ctx, t, token)
			return
		}
		if ErrorKind(err) != KindWaitTimeout {
			return // the lease is gone, or the server unreachable: it gives back by itself
		}
		markLeft()
		time.Sleep(cleanUpDelay)
		if token, err := s.heldBy(ctx, t); err == nil && token != 0 {
			_ = s.releaseToken(ctx, t, token)
		}
	}()
	return left
}

// heldBy is the token this session holds t with, or 0.
func (s *Session) heldBy(ctx context.Context, t target) (uint64, error) {
	switch t.kind {
	case "semaphore":
		status, err := s.client.SemaphoreStatus(ctx, t.name)
		if err != nil || status == nil {
			return 0, err
		}
		for _, holder := range status.Holders {
			if holder.SessionID == s.handle.ID && len(holder.Permits) > 0 {
				return holder.Permits[0].Token, nil
			}
		}
		return 0, nil
	case "election":
		leader, err := s.client.Leader(ctx, t.name)
		if err != nil || leader == nil || leader.SessionID != s.handle.ID {
			return 0, err
		}
		return leader.Term, nil
	}
	status, err := s.client.Status(ctx, t.name)
	if err != nil || status == nil || status.LockDelay {
		return 0, err
	}
	for _, holder := range status.Holders {
		if holder.SessionID == s.handle.ID {
			return holder.Token, nil
		}
	}
	if status.Holder == s.handle.ID && len(status.Holders) == 0 {
		return status.Token, nil
	}
	return 0, nil
}

type releaseBody struct {
	SessionID     uint64 `json:"session_id"`
	SessionSecret string `json:"session_secret"`
	Lock          string `json:"lock"`
	Token         uint64 `json:"token"`
}

// releaseToken releases t's grant, repeated through outages while the
// lease lasts (and ctx): a live session holds its locks until it releases
// them, so not_holder after an attempt whose answer was lost means that
// attempt went through.
func (s *Session) releaseToken(ctx context.Context, t target, token uint64) error {
	release := post(t.releasePath(), releaseBody{s.handle.ID, s.handle.Secret, t.name, token})
	maybeApplied := false
	return s.client.retrying(ctx, retryPolicy{lost: s.leaseError}, func(ctx context.Context) error {
		attempt, cancel := context.WithDeadline(ctx, s.Deadline())
		defer cancel()
		err := s.client.send(attempt, release, nil)
		if err == nil {
			return nil
		}
		switch ErrorKind(err) {
		case KindNotHolder:
			if maybeApplied {
				return nil
			}
		case KindUnavailable:
			maybeApplied = true
		}
		return err
	})
}

// ---- guards ----------------------------------------------------------

// ErrReleased is what a released guard's Err returns.
var ErrReleased = errors.New("deadbolt: the guard was released")

// Guard is a held lock (or semaphore permits, or an election's
// leadership) and its fencing token. Pass Token to whatever the lock
// protects, and have it refuse tokens lower than the highest it has seen.
//
// The guard, not a goroutine, owns the lock: hand it to another goroutine
// freely. It is safe for concurrent use.
type Guard struct {
	session *Session
	target  target
	token   uint64
	permits []Permit
	ctx     context.Context
	cancel  context.CancelFunc

	ownsSession bool
	mu          sync.Mutex
	released    bool
	releaseErr  error
	// endedBy is what Err says once the guard is released: the loss of
	// the lease if it came first, else ErrReleased. Kept, rather than read
	// from the session, because the session lives on (a shared one) or is
	// closed by the release (its own), and neither says why this guard
	// ended.
	endedBy error
}

func newGuard(s *Session, t target, token uint64, permits []Permit) *Guard {
	g := &Guard{session: s, target: t, token: token, permits: permits}
	g.ctx, g.cancel = context.WithCancel(s.ctx)
	return g
}

// Token is the fencing token: strictly greater than every token granted
// before, for any lock. For a semaphore it is the first permit's, for an
// election the term.
func (g *Guard) Token() uint64 { return g.token }

// Name is the lock's (semaphore's, election's) name.
func (g *Guard) Name() string { return g.target.name }

// Session is the session that holds the lock.
func (g *Guard) Session() *Session { return g.session }

// Permits are a semaphore's permits, each with its token and slot (nil
// for a lock).
func (g *Guard) Permits() []Permit { return append([]Permit(nil), g.permits...) }

// Done is closed once the lock can no longer be trusted: the lease came
// within its margin of ending unrenewed (before the server could grant the
// lock to anyone else), the server ended it, or the guard was released.
func (g *Guard) Done() <-chan struct{} { return g.ctx.Done() }

// Context is cancelled when Done is closed, so that
// db.QueryContext(guard.Context(), ...) stops when the lock can no longer
// be trusted. It carries no values; see Bind to join it with a context of
// your own.
func (g *Guard) Context() context.Context { return g.ctx }

// Bind returns a context cancelled when parent is, or when the guard's
// Done is closed, whichever comes first, with parent's values and
// deadline. Call cancel when done with it.
func (g *Guard) Bind(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	stop := make(chan struct{})
	go func() {
		select {
		case <-g.ctx.Done():
			cancel()
		case <-ctx.Done():
		case <-stop:
		}
	}()
	return ctx, func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		cancel()
	}
}

// Err is nil while the lock can be trusted; then why not: the session's
// reason (matching ErrLost), or ErrReleased if the guard was released
// before that.
func (g *Guard) Err() error {
	g.mu.Lock()
	endedBy := g.endedBy
	g.mu.Unlock()
	if endedBy != nil {
		return endedBy
	}
	return g.session.Err()
}

// Release releases the lock (resigns an election, returns the permits),
// repeated through outages and leader changes until ctx ends or the lease
// does. A guard whose session is its own (Client.Semaphore, Campaign, and
// Lock and TryLock with WithOwnSession) closes its session instead, which
// releases it in one call; a guard of the client's shared session leaves
// that session to the client's other locks. It returns an error
// matching ErrLost if the lease was lost before the release, since the
// lock may then have been someone else's meanwhile. Releasing twice does
// nothing more.
func (g *Guard) Release(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.released {
		return g.releaseErr
	}
	g.released = true
	lostBefore := g.session.Err()
	g.endedBy = ErrReleased
	if lostBefore != nil {
		g.endedBy = lostBefore
	}
	if g.ownsSession {
		g.session.forget(g.target.name)
		g.cancel()
		err := g.session.Close(ctx)
		if lostBefore != nil && !errors.Is(lostBefore, ErrSessionClosed) {
			err = lostBefore
		}
		g.releaseErr = err
		return err
	}
	err := g.session.releaseToken(ctx, g.target, g.token)
	g.session.forget(g.target.name)
	g.cancel()
	if err == nil && lostBefore != nil {
		err = lostBefore
	}
	g.releaseErr = err
	return err
}

// ---- taking locks ----------------------------------------------------------

func lockTarget(name string, cfg lockConfig) target {
	return target{kind: "lock", name: name, mode: cfg.mode, lockDelay: cfg.lockDelay}
}

// Lock takes the lock name in this session, waiting in its FIFO queue
// until granted, or until ctx ends: at its deadline with an error matching
// ErrWaitTimeout (and context.DeadlineExceeded), on a cancel with one
// matching ErrWaitCancelled (and context.Canceled); either way no queue
// place or grant is left behind. Options: Shared, Exclusive, WithLockDelay.
func (s *Session) Lock(ctx context.Context, name string, opts ...LockOption) (*Guard, error) {
	return s.acquire(ctx, lockTarget(name, lockOptions(opts)), true)
}

// TryLock takes the lock name if it is free, and fails with an error
// matching ErrBusy if it is not.
func (s *Session) TryLock(ctx context.Context, name string, opts ...LockOption) (*Guard, error) {
	return s.acquire(ctx, lockTarget(name, lockOptions(opts)), false)
}

// Semaphore takes count permits of the semaphore name of capacity permits
// (0: whatever capacity an admin defined it with), waiting in FIFO order
// as Lock does. Each permit has its own token and slot (Guard.Permits);
// Guard.Token is the first's (docs/semaphores.md).
func (s *Session) Semaphore(ctx context.Context, name string, capacity, count uint32) (*Guard, error) {
	return s.acquire(ctx, target{kind: "semaphore", name: name, capacity: capacity, count: count}, true)
}

// TrySemaphore takes count permits if they fit now; ErrBusy if not.
func (s *Session) TrySemaphore(ctx context.Context, name string, capacity, count uint32) (*Guard, error) {
	return s.acquire(ctx, target{kind: "semaphore", name: name, capacity: capacity, count: count}, false)
}

// QueuePosition is this session's place in the lock name's queue (0 is
// next), or -1 if it is not waiting.
func (s *Session) QueuePosition(ctx context.Context, name string) (int, error) {
	status, err := s.client.Status(ctx, name)
	if err != nil || status == nil {
		return -1, err
	}
	for i, waiter := range status.Waiters {
		if waiter == s.handle.ID {
			return i, nil
		}
	}
	return -1, nil
}

// owned runs acquire in a session of its own, which the guard's Release
// closes.
func (c *Client) owned(ctx context.Context, opts []LockOption, acquire func(*Session) (*Guard, error)) (*Guard, error) {
	s, err := c.NewSession(ctx, opts...)
	if err != nil {
		return nil, err
	}
	g, err := acquire(s)
	if err != nil {
		closeCtx, cancel := context.WithTimeout(context.Background(), s.client.callTimeout)
		defer cancel()
		_ = s.Close(closeCtx)
		return nil, err
	}
	g.ownsSession = true
	return g, nil
}

// Lock takes the lock name, waiting in FIFO order as Session.Lock does:
// until granted, or until ctx ends.
//
// The lock is taken in a session the client shares between its locks of
// the same TTL and margin (WithTTL, WithMargin; opened on first use,
// renewed by one goroutine, closed once idle for a third of the TTL): two
// round trips a lock, acquire and release. Sharing a lease means sharing
// its loss: if it cannot be renewed, every lock of this client held in it
// is lost at once (each guard's Done is closed and its Context cancelled
// together). With WithOwnSession the lock gets a session of its own
// instead, closed when the guard is released: its loss is its own, for
// two more round trips.
//
//	guard, err := client.Lock(ctx, "invoice-981", deadbolt.WithTTL(15*time.Second))
//	if err != nil { return err }
//	defer guard.Release(context.Background())
//	err = writeInvoice(guard.Context(), guard.Token())
func (c *Client) Lock(ctx context.Context, name string, opts ...LockOption) (*Guard, error) {
	return c.take(ctx, name, opts, true)
}

// TryLock takes the lock name if it is free, in the client's shared
// session or with WithOwnSession in one of its own (see Lock); an error
// matching ErrBusy if another session holds it.
func (c *Client) TryLock(ctx context.Context, name string, opts ...LockOption) (*Guard, error) {
	return c.take(ctx, name, opts, false)
}

// Semaphore takes count permits of a semaphore in a session of its own
// (see Session.Semaphore).
func (c *Client) Semaphore(ctx context.Context, name string, capacity, count uint32, opts ...LockOption) (*Guard, error) {
	return c.owned(ctx, opts, func(s *Session) (*Guard, error) { return s.Semaphore(ctx, name, capacity, count) })
}

// queryOf builds a query string.
func queryOf(pairs ...string) url.Values {
	q := url.Values{}
	for i := 0; i+1 < len(pairs); i += 2 {
		q.Set(pairs[i], pairs[i+1])
	}
	return q
}
