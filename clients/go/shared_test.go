package deadbolt_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	deadbolt "github.com/deadbolt/deadbolt-go"
	"github.com/deadbolt/deadbolt-go/internal/testserver"
)

// Client.Lock and TryLock take a client's locks of one TTL and margin in
// one session; a second caller of a held name, another TTL, and
// WithOwnSession get sessions of their own.
func TestLocksShareASession(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	a, err := client.Lock(ctx, "go/shared/a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.TryLock(ctx, "go/shared/b")
	if err != nil {
		t.Fatal(err)
	}
	if a.Session().ID() != b.Session().ID() {
		t.Fatalf("two locks of one client in sessions %d and %d", a.Session().ID(), b.Session().ID())
	}
	if _, err := client.TryLock(ctx, "go/shared/a"); !errors.Is(err, deadbolt.ErrBusy) {
		t.Fatalf("a second caller of a held name: %v, want ErrBusy", err)
	}
	longer, err := client.Lock(ctx, "go/shared/c", deadbolt.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	own, err := client.Lock(ctx, "go/shared/d", deadbolt.WithOwnSession())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []*deadbolt.Guard{longer, own} {
		if g.Session().ID() == a.Session().ID() {
			t.Fatalf("%s is in the shared session of the default TTL", g.Name())
		}
	}
	if err := own.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(own.Session().Err(), deadbolt.ErrSessionClosed) {
		t.Fatalf("an own session after its release: %v", own.Session().Err())
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.Done():
	default:
		t.Fatal("a released guard's Done is open")
	}
	if !errors.Is(a.Err(), deadbolt.ErrReleased) {
		t.Fatalf("a released guard's Err: %v", a.Err())
	}
	// Releasing one lock of the session leaves the others held.
	select {
	case <-b.Done():
		t.Fatalf("the release of another lock ended this one: %v", b.Err())
	default:
	}
	status, err := client.Status(ctx, "go/shared/b")
	if err != nil || status == nil || status.Holder != b.Session().ID() || status.Token != b.Token() {
		t.Fatalf("status %+v %v", status, err)
	}
	// Sharing the session means sharing its end: closing it ends both
	// guards still held in it at once, and releases their locks.
	again, err := client.Lock(ctx, "go/shared/a")
	if err != nil {
		t.Fatal(err)
	}
	if again.Session().ID() != b.Session().ID() {
		t.Fatalf("a name released in the shared session taken in session %d, not %d", again.Session().ID(), b.Session().ID())
	}
	if err := b.Session().Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, g := range []*deadbolt.Guard{again, b} {
		select {
		case <-g.Context().Done():
		default:
			t.Fatalf("%s is held on in a closed shared session", g.Name())
		}
		if !errors.Is(g.Err(), deadbolt.ErrSessionClosed) {
			t.Fatalf("%s: %v", g.Name(), g.Err())
		}
		if status, err := client.Status(ctx, g.Name()); err != nil || status != nil {
			t.Fatalf("%s after the close: %+v %v", g.Name(), status, err)
		}
	}
	_ = longer.Release(ctx)
}

// A frozen server: the shared lease cannot be renewed, and every lock
// held in it is lost together, a margin before the server could grant
// them to anyone else. The next Lock opens a fresh session.
func TestSharedSessionLostTogether(t *testing.T) {
	server := testserver.Start(t)
	client := connectTo(t, server.Endpoint)
	ctx := within(t, 30*time.Second)
	ttl := 2 * time.Second
	a, err := client.Lock(ctx, "go/together/a", deadbolt.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	b, err := client.Lock(ctx, "go/together/b", deadbolt.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	server.Freeze()
	frozen := time.Now()
	for _, g := range []*deadbolt.Guard{a, b} {
		select {
		case <-g.Done():
		case <-time.After(2 * ttl):
			server.Thaw()
			t.Fatalf("%s: Done stayed open past the TTL of a frozen server", g.Name())
		}
		if !errors.Is(g.Err(), deadbolt.ErrExpired) {
			t.Fatalf("%s: %v", g.Name(), g.Err())
		}
	}
	after := time.Since(frozen)
	server.Thaw()
	if after >= ttl {
		t.Fatalf("both Done closed %v after the freeze, past the %v TTL", after, ttl)
	}
	// Released as a holder would (defer guard.Release): lost, even if the
	// thawed server answered a keepalive sent before the lease's end (the
	// client ends a lease it counted lost rather than let it live on).
	for _, g := range []*deadbolt.Guard{a, b} {
		if err := g.Release(ctx); !errors.Is(err, deadbolt.ErrLost) {
			t.Fatalf("%s: releasing a lost lock: %v, want ErrLost", g.Name(), err)
		}
	}
	next, err := client.Lock(ctx, "go/together/a", deadbolt.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	if next.Session().ID() == a.Session().ID() || next.Token() <= b.Token() {
		t.Fatalf("after the loss: session %d token %d", next.Session().ID(), next.Token())
	}
	_ = next.Release(ctx)
}

// A shared session the server ended before the client knew: a Lock that
// picks it is refused unknown_session, ends it for every lock in it, and
// is granted in a fresh session.
func TestSharedSessionEndedByTheServer(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	a, err := client.Lock(ctx, "go/ended/a", deadbolt.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	handle := a.Session().Handle()
	body, _ := json.Marshal(map[string]any{"session_id": handle.ID, "session_secret": handle.Secret})
	answer, err := http.Post(shared.Endpoint+"/v1/session/close", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	answer.Body.Close()
	if answer.StatusCode != 200 {
		t.Fatalf("closing the session behind the client's back: HTTP %d", answer.StatusCode)
	}
	b, err := client.Lock(ctx, "go/ended/b", deadbolt.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if b.Session().ID() == handle.ID {
		t.Fatal("granted in the session the server ended")
	}
	select {
	case <-a.Done():
	default:
		t.Fatal("a guard of the ended session is still open")
	}
	if !errors.Is(a.Err(), deadbolt.ErrLost) {
		t.Fatalf("a guard of the ended session: %v", a.Err())
	}
}

// A shared session in which no lock was held or taken for a renewal
// interval is closed, on the server too; Client.Close closes the others,
// releasing what they hold.
func TestSharedSessionClosedWhenIdleOrWithTheClient(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	g, err := client.Lock(ctx, "go/idle", deadbolt.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	s := g.Session()
	waitUntil(t, "the idle session closed", 3*time.Second, func() bool { return errors.Is(s.Err(), deadbolt.ErrSessionClosed) })
	if _, err := client.KeepAlive(ctx, s.Handle()); !errors.Is(err, deadbolt.ErrLost) {
		t.Fatalf("a keepalive of the idle-closed session: %v", err)
	}
	held, err := client.Lock(ctx, "go/idle", deadbolt.WithTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if held.Session().ID() == s.ID() {
		t.Fatal("a lock taken in the closed session")
	}
	// Held, it keeps its session open past several intervals.
	time.Sleep(1500 * time.Millisecond)
	if err := held.Err(); err != nil {
		t.Fatalf("a held lock's shared session: %v", err)
	}
	if err := client.Close(); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(held.Err(), deadbolt.ErrSessionClosed) {
		t.Fatalf("a lock of a closed client: %v", held.Err())
	}
	if status, err := connect(t).Status(ctx, "go/idle"); err != nil || status != nil {
		t.Fatalf("after the client's close: %+v %v", status, err)
	}
}
