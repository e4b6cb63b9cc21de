package deadbolt_test

import (
	"context"
	"errors"
	"testing"
	"time"

	deadbolt "github.com/deadbolt/deadbolt-go"
)

// With framed calls (the default over http://), a lock's acquire,
// release and keepalive go framed and answer as over HTTP: the token,
// busy, the TTL, not holder.
func TestFramedCalls(t *testing.T) {
	if shared == nil {
		t.Skip("no server")
	}
	client, err := deadbolt.New(shared.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := within(t, 20*time.Second)
	s := session(t, client, deadbolt.WithTTL(2*time.Second))
	other := session(t, client)
	g, err := s.Lock(ctx, "go/framed")
	if err != nil || g.Token() == 0 {
		t.Fatalf("framed acquire: %v %v", g, err)
	}
	if _, err := other.TryLock(ctx, "go/framed"); !errors.Is(err, deadbolt.ErrBusy) {
		t.Fatalf("a framed acquire of a held lock: %v", err)
	}
	status, err := client.Status(ctx, "go/framed")
	if err != nil || status == nil || status.Holder != s.ID() || status.Token != g.Token() {
		t.Fatalf("status %+v %v", status, err)
	}
	if ttl, err := client.KeepAlive(ctx, s.Handle()); err != nil || ttl != 2*time.Second {
		t.Fatalf("a framed keepalive: %v %v", ttl, err)
	}
	time.Sleep(1500 * time.Millisecond) // renewed by the session meanwhile
	if err := s.Err(); err != nil {
		t.Fatalf("the lease over framed keepalives: %v", err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	timed, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	g2, err := other.Lock(timed, "go/framed")
	if err != nil || g2.Token() <= g.Token() {
		t.Fatalf("after the framed release: %v %v", g2, err)
	}
	_ = g2.Release(ctx)
}
