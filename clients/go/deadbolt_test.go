package deadbolt_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	deadbolt "github.com/deadbolt/deadbolt-go"
	"github.com/deadbolt/deadbolt-go/internal/testserver"
)

// shared is one server for the tests that need nothing of their own
// (each uses lock names of its own); nil without a binary.
var shared *testserver.Server

func TestMain(m *testing.M) {
	code := func() int {
		if bin, ok := testserver.Binary(); ok {
			dir, err := os.MkdirTemp("", "deadbolt-go-test")
			if err != nil {
				panic(err)
			}
			defer os.RemoveAll(dir)
			shared, err = testserver.StartAt(bin, dir)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer shared.Stop()
		}
		return m.Run()
	}()
	os.Exit(code)
}

// connect is a client of the shared server.
func connect(t testing.TB) *deadbolt.Client {
	t.Helper()
	if shared == nil {
		testserver.Available(t)
	}
	return connectTo(t, shared.Endpoint)
}

func connectTo(t testing.TB, endpoints ...string) *deadbolt.Client {
	t.Helper()
	client, err := deadbolt.New(endpoints)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func within(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func session(t testing.TB, client *deadbolt.Client, opts ...deadbolt.LockOption) *deadbolt.Session {
	t.Helper()
	s, err := client.NewSession(within(t, 10*time.Second), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func waitUntil(t testing.TB, what string, limit time.Duration, done func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func queued(t testing.TB, client *deadbolt.Client, name string, id uint64) bool {
	status, err := client.Status(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if status == nil {
		return false
	}
	for _, waiter := range status.Waiters {
		if waiter == id {
			return true
		}
	}
	return false
}

func TestLockTryLockRelease(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	guard, err := client.Lock(ctx, "go/basic", deadbolt.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if guard.Token() == 0 || guard.Name() != "go/basic" {
		t.Fatalf("guard %d %q", guard.Token(), guard.Name())
	}
	if _, err := client.TryLock(ctx, "go/basic"); !errors.Is(err, deadbolt.ErrBusy) {
		t.Fatalf("TryLock of a held lock: %v, want ErrBusy", err)
	}
	status, err := client.Status(ctx, "go/basic")
	if err != nil || status == nil || status.Holder != guard.Session().ID() || status.Token != guard.Token() {
		t.Fatalf("status %+v, %v", status, err)
	}
	if ok, err := client.Check(ctx, "go/basic", guard.Token()); err != nil || !ok {
		t.Fatalf("check of the current token: %v %v", ok, err)
	}
	if err := guard.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-guard.Done():
	default:
		t.Fatal("a released guard's Done is open")
	}
	if !errors.Is(guard.Err(), deadbolt.ErrReleased) && !errors.Is(guard.Err(), deadbolt.ErrSessionClosed) {
		t.Fatalf("released guard's Err: %v", guard.Err())
	}
	if err := guard.Release(ctx); err != nil {
		t.Fatalf("a second release: %v", err)
	}
	next, err := client.TryLock(ctx, "go/basic")
	if err != nil {
		t.Fatal(err)
	}
	defer next.Release(ctx)
	if next.Token() <= guard.Token() {
		t.Fatalf("token %d after %d", next.Token(), guard.Token())
	}
	if ok, _ := client.Check(ctx, "go/basic", guard.Token()); ok {
		t.Fatal("the old token checks as current")
	}
}

func TestOneHolderPerNamePerSession(t *testing.T) {
	client := connect(t)
	ctx := within(t, 10*time.Second)
	s := session(t, client)
	g, err := s.Lock(ctx, "go/once")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.TryLock(ctx, "go/once"); !errors.Is(err, deadbolt.ErrInvalidArgument) {
		t.Fatalf("a second taker in one session: %v", err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g, err = s.TryLock(ctx, "go/once")
	if err != nil {
		t.Fatal(err)
	}
	_ = g.Release(ctx)
}

func TestFIFOWaiters(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	holder := session(t, client)
	held, err := holder.Lock(ctx, "go/fifo")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		place int
		guard *deadbolt.Guard
		err   error
	}
	results := make(chan result, 3)
	var order []uint64
	for place := 0; place < 3; place++ {
		s := session(t, client)
		order = append(order, s.ID())
		go func(place int) {
			g, err := s.Lock(ctx, "go/fifo")
			results <- result{place, g, err}
		}(place)
		waitUntil(t, "queued", 5*time.Second, func() bool { return queued(t, client, "go/fifo", s.ID()) })
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	last := held.Token()
	for want := 0; want < 3; want++ {
		r := <-results
		if r.err != nil || r.place != want {
			t.Fatalf("granted place %d (%v), want place %d", r.place, r.err, want)
		}
		if r.guard.Token() <= last || r.guard.Session().ID() != order[want] {
			t.Fatalf("token %d after %d", r.guard.Token(), last)
		}
		last = r.guard.Token()
		if err := r.guard.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestWaitTimeout(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	held, err := client.Lock(ctx, "go/timeout")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	waiter := session(t, client)
	wait, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
	defer cancel()
	started := time.Now()
	_, err = waiter.Lock(wait, "go/timeout")
	waited := time.Since(started)
	if !errors.Is(err, deadbolt.ErrWaitTimeout) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a timed-out wait: %v", err)
	}
	if waited < 600*time.Millisecond || waited > 5*time.Second {
		t.Fatalf("a 700ms wait took %v", waited)
	}
	if queued(t, client, "go/timeout", waiter.ID()) {
		t.Fatal("the timed-out waiter is still queued")
	}
}

func TestCancelGivesQueuePlaceBack(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	held, err := client.Lock(ctx, "go/cancel")
	if err != nil {
		t.Fatal(err)
	}
	waiter := session(t, client)
	wait, cancel := context.WithCancel(ctx)
	failed := make(chan error, 1)
	go func() {
		_, err := waiter.Lock(wait, "go/cancel")
		failed <- err
	}()
	waitUntil(t, "queued", 5*time.Second, func() bool { return queued(t, client, "go/cancel", waiter.ID()) })
	cancel()
	err = <-failed
	if !errors.Is(err, deadbolt.ErrWaitCancelled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled wait: %v", err)
	}
	// Well before the server's own 3s grace for a caller that went away.
	started := time.Now()
	waitUntil(t, "queue place given back", 1500*time.Millisecond, func() bool { return !queued(t, client, "go/cancel", waiter.ID()) })
	t.Logf("queue place given back %v after the cancel returned", time.Since(started).Round(time.Millisecond))
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Nobody else waits, and the cancelled waiter did not get it.
	if status, _ := client.Status(ctx, "go/cancel"); status != nil {
		t.Fatalf("after the release: %+v", status)
	}
	// The name is free in the waiter's session again.
	g, err := waiter.Lock(ctx, "go/cancel")
	if err != nil {
		t.Fatal(err)
	}
	_ = g.Release(ctx)
}

func TestCancelAfterGrantReleasesIt(t *testing.T) {
	// A wait cancelled just as the grant comes must not leave the lock
	// held by a session nobody uses.
	client := connect(t)
	ctx := within(t, 20*time.Second)
	for i := 0; i < 5; i++ {
		held, err := client.Lock(ctx, "go/cancel-race")
		if err != nil {
			t.Fatal(err)
		}
		waiter := session(t, client)
		wait, cancel := context.WithCancel(ctx)
		failed := make(chan error, 1)
		go func() {
			g, err := waiter.Lock(wait, "go/cancel-race")
			if err == nil {
				err = g.Release(ctx)
				if err == nil {
					err = errors.New("granted")
				}
			}
			failed <- err
		}()
		waitUntil(t, "queued", 5*time.Second, func() bool { return queued(t, client, "go/cancel-race", waiter.ID()) })
		go func() { _ = held.Release(ctx) }()
		time.Sleep(time.Duration(i) * time.Millisecond)
		cancel()
		<-failed
		waitUntil(t, "nobody holds it", 3*time.Second, func() bool {
			status, err := client.Status(ctx, "go/cancel-race")
			return err == nil && status == nil
		})
	}
}

func TestRenewalKeepsTheLock(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	guard, err := client.Lock(ctx, "go/renewed", deadbolt.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-guard.Done():
		t.Fatalf("Done closed while renewals could get through: %v", guard.Err())
	case <-time.After(3 * time.Second):
	}
	status, err := client.Status(ctx, "go/renewed")
	if err != nil || status == nil || status.Token != guard.Token() {
		t.Fatalf("after 3 TTLs: %+v %v", status, err)
	}
	if err := guard.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestLostBeforeTheServerCouldRegrant(t *testing.T) {
	server := testserver.Start(t)
	client := connectTo(t, server.Endpoint)
	ctx := within(t, 30*time.Second)
	ttl := 2 * time.Second
	guard, err := client.Lock(ctx, "go/frozen", deadbolt.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(ttl / 2)
	work := guard.Context()
	server.Freeze()
	frozen := time.Now()
	select {
	case <-guard.Done():
	case <-time.After(2 * ttl):
		server.Thaw()
		t.Fatal("Done stayed open past the TTL of a frozen server")
	}
	after := time.Since(frozen)
	server.Thaw()
	if after >= ttl {
		t.Fatalf("Done closed %v after the freeze, past the %v TTL", after, ttl)
	}
	t.Logf("Done closed %v before the frozen server's lease could end", (ttl - after).Round(time.Millisecond))
	if work.Err() == nil {
		t.Fatal("the guard's context is not cancelled")
	}
	// The server, thawed before the lease's end, answers the keepalive
	// that was waiting: too late to revive a lease the client counted
	// lost (Err went back to nil after Done, and Release said nil).
	time.Sleep(ttl)
	if !errors.Is(guard.Err(), deadbolt.ErrLost) || !errors.Is(guard.Err(), deadbolt.ErrExpired) {
		t.Fatalf("guard.Err: %v", guard.Err())
	}
	if err := guard.Release(ctx); !errors.Is(err, deadbolt.ErrLost) {
		t.Fatalf("releasing a lost lock: %v, want ErrLost", err)
	}
	next, err := client.Lock(ctx, "go/frozen")
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= guard.Token() {
		t.Fatalf("next token %d after %d", next.Token(), guard.Token())
	}
	_ = next.Release(ctx)
}

func TestServerRestartMidWait(t *testing.T) {
	// Failover on one node: the server is killed (-9) and restarted on the
	// same data while one client holds a lock and another waits for it.
	// The holder keeps it, its release goes through, and the waiter's cut
	// acquire is repeated and granted once.
	server := testserver.Start(t)
	dead := fmt.Sprintf("http://127.0.0.1:%d", testserver.FreePort())
	client := connectTo(t, dead, server.Endpoint) // a dead endpoint first
	ctx := within(t, 40*time.Second)
	holder := session(t, client, deadbolt.WithTTL(10*time.Second))
	held, err := holder.Lock(ctx, "go/restart")
	if err != nil {
		t.Fatal(err)
	}
	waiter := session(t, client, deadbolt.WithTTL(10*time.Second))
	granted := make(chan *deadbolt.Guard, 1)
	go func() {
		g, err := waiter.Lock(ctx, "go/restart")
		if err != nil {
			t.Errorf("the waiter: %v", err)
		}
		granted <- g
	}()
	waitUntil(t, "queued", 5*time.Second, func() bool { return queued(t, client, "go/restart", waiter.ID()) })
	server.Kill()
	if err := server.Restart(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "queued again", 10*time.Second, func() bool { return queued(t, client, "go/restart", waiter.ID()) })
	select {
	case <-held.Done():
		t.Fatalf("the holder lost its lease across the restart: %v", held.Err())
	default:
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g := <-granted
	if g == nil {
		t.FailNow()
	}
	if g.Token() <= held.Token() {
		t.Fatalf("token %d after %d", g.Token(), held.Token())
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if status, err := client.Status(ctx, "go/restart"); err != nil || status != nil {
		t.Fatalf("a second grant from the repeated acquire: %+v %v", status, err)
	}
}

func TestErrors(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	_, err := client.NewSession(ctx, deadbolt.WithTTL(100*time.Millisecond))
	if !errors.Is(err, deadbolt.ErrInvalidArgument) {
		t.Fatalf("a 100ms TTL: %v", err)
	}
	var failure *deadbolt.Error
	if !errors.As(err, &failure) || failure.Kind != deadbolt.KindInvalidArgument || failure.Message == "" {
		t.Fatalf("errors.As: %#v", err)
	}
	s := session(t, client)
	for _, name := range []string{"bell\a", string(make([]byte, 513))} {
		if _, err := s.TryLock(ctx, name); !errors.Is(err, deadbolt.ErrInvalidArgument) {
			t.Fatalf("lock name %q: %v", name, err)
		}
	}
	nobody := connectTo(t, fmt.Sprintf("127.0.0.1:%d", testserver.FreePort()))
	short, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	started := time.Now()
	_, err = nobody.Lock(short, "go/nobody")
	if !errors.Is(err, deadbolt.ErrUnavailable) || !deadbolt.HadNoEffect(err) {
		t.Fatalf("a server nobody runs: %v (had no effect: %v)", err, deadbolt.HadNoEffect(err))
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("not the context's deadline: %v", err)
	}
	if took := time.Since(started); took > 3*time.Second {
		t.Fatalf("gave up after %v, past the context's 1.5s", took)
	}
	// Someone else's session, by id only.
	other := session(t, client)
	_, err = client.KeepAlive(ctx, deadbolt.SessionHandle{ID: other.ID(), Secret: "not-the-secret"})
	if !errors.Is(err, deadbolt.ErrPermission) {
		t.Fatalf("a keepalive with a wrong secret: %v", err)
	}
	if _, err := client.KeepAlive(ctx, other.Handle()); err != nil {
		t.Fatal(err)
	}
}

func TestSessionClose(t *testing.T) {
	client := connect(t)
	ctx := within(t, 10*time.Second)
	s := session(t, client)
	if _, err := s.Lock(ctx, "go/close/a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(s.Err(), deadbolt.ErrSessionClosed) || !errors.Is(s.Err(), deadbolt.ErrLost) {
		t.Fatalf("closed session's Err: %v", s.Err())
	}
	if status, err := client.Status(ctx, "go/close/a"); err != nil || status != nil {
		t.Fatalf("closing the session left %+v %v", status, err)
	}
	if _, err := s.TryLock(ctx, "go/close/b"); !errors.Is(err, deadbolt.ErrLost) {
		t.Fatalf("a lock in a closed session: %v", err)
	}
}

func TestParseEndpointsAndHandles(t *testing.T) {
	client, err := deadbolt.New("127.0.0.1:1, http://10.0.0.2 ,https://h:9")
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(client.Endpoints())
	if got != "[http://127.0.0.1:1 http://10.0.0.2:7070 https://h:9]" {
		t.Fatal(got)
	}
	if _, err := deadbolt.New("ftp://x"); !errors.Is(err, deadbolt.ErrInvalidArgument) {
		t.Fatal(err)
	}
	if client, err := deadbolt.New(""); err != nil || client.Endpoints()[0] != deadbolt.DefaultEndpoint {
		t.Fatal(err)
	}
	h, err := deadbolt.ParseSessionHandle("12.3f9a")
	if err != nil || h.ID != 12 || h.Secret != "3f9a" || h.String() != "12.3f9a" {
		t.Fatal(h, err)
	}
	if _, err := deadbolt.ParseSessionHandle("x.y"); err == nil {
		t.Fatal("parsed x.y")
	}
}
