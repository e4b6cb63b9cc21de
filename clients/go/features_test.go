package deadbolt_test

import (
	"context"
	"errors"
	"testing"
	"time"

	deadbolt "github.com/deadbolt/deadbolt-go"
)

func TestReadWriteLock(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	r1, err := client.Lock(ctx, "go/rw", deadbolt.Shared())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := client.TryLock(ctx, "go/rw", deadbolt.Shared())
	if err != nil {
		t.Fatalf("a second reader: %v", err)
	}
	if _, err := client.TryLock(ctx, "go/rw", deadbolt.Exclusive()); !errors.Is(err, deadbolt.ErrBusy) {
		t.Fatalf("a writer beside readers: %v", err)
	}
	status, err := client.Status(ctx, "go/rw")
	if err != nil || status == nil || len(status.Holders) != 2 || status.Mode != "shared" {
		t.Fatalf("status %+v %v", status, err)
	}
	writer := make(chan *deadbolt.Guard, 1)
	go func() {
		g, err := client.Lock(ctx, "go/rw", deadbolt.Exclusive())
		if err != nil {
			t.Error(err)
		}
		writer <- g
	}()
	_ = r1.Release(ctx)
	_ = r2.Release(ctx)
	w := <-writer
	if w == nil || w.Token() <= r2.Token() {
		t.FailNow()
	}
	_ = w.Release(ctx)
}

func TestSemaphore(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	a, err := client.Semaphore(ctx, "go/sem", 3, 2)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Permits()) != 2 || a.Token() != a.Permits()[0].Token {
		t.Fatalf("permits %+v token %d", a.Permits(), a.Token())
	}
	s := session(t, client)
	if _, err := s.TrySemaphore(ctx, "go/sem", 3, 2); !errors.Is(err, deadbolt.ErrBusy) {
		t.Fatalf("2 more of 3 with 2 held: %v", err)
	}
	b, err := s.TrySemaphore(ctx, "go/sem", 3, 1)
	if err != nil {
		t.Fatal(err)
	}
	status, err := client.SemaphoreStatus(ctx, "go/sem")
	if err != nil || status == nil || status.Capacity != 3 || len(status.Holders) != 2 {
		t.Fatalf("status %+v %v", status, err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if status, err := client.SemaphoreStatus(ctx, "go/sem"); err != nil || (status != nil && len(status.Holders) != 0) {
		t.Fatalf("after the releases: %+v %v", status, err)
	}
}

// An admin's semaphore: defined, it stays while unused and lends its
// capacity to acquirers that ask for 0; deleted, it goes.
func TestDefinedSemaphore(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	defined, err := client.DefineSemaphore(ctx, "go/sem/defined", 4)
	if err != nil || defined == nil || !defined.Defined || defined.Capacity != 4 {
		t.Fatalf("defined %+v %v", defined, err)
	}
	g, err := client.Semaphore(ctx, "go/sem/defined", 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Permits()) != 3 {
		t.Fatalf("permits %+v", g.Permits())
	}
	if resized, err := client.DefineSemaphore(ctx, "go/sem/defined", 6); err != nil || resized == nil || resized.Capacity != 6 {
		t.Fatalf("resized while held: %+v %v", resized, err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if status, err := client.SemaphoreStatus(ctx, "go/sem/defined"); err != nil || status == nil || !status.Defined {
		t.Fatalf("unused, a defined semaphore stays: %+v %v", status, err)
	}
	if left, err := client.DeleteSemaphore(ctx, "go/sem/defined"); err != nil || left != nil {
		t.Fatalf("deleted, unused: %+v %v", left, err)
	}
	if status, err := client.SemaphoreStatus(ctx, "go/sem/defined"); err != nil || status != nil {
		t.Fatalf("after the delete: %+v %v", status, err)
	}
	if _, err := client.DeleteSemaphore(ctx, "go/sem/defined"); !errors.Is(err, deadbolt.ErrInvalidArgument) {
		t.Fatalf("deleting one nobody defined: %v", err)
	}
}

func TestElection(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	observe, stop := context.WithCancel(ctx)
	defer stop()
	leaders := client.Observe(observe, "go/election")
	if first := <-leaders; first.SessionID != 0 {
		t.Fatalf("a leader before any campaign: %+v", first)
	}
	one, err := client.Campaign(ctx, "go/election", "10.0.0.7:8080")
	if err != nil {
		t.Fatal(err)
	}
	next := func(want string) deadbolt.LeaderInfo {
		t.Helper()
		select {
		case info := <-leaders:
			if info.Value != want {
				t.Fatalf("observed %+v, want value %q", info, want)
			}
			return info
		case <-time.After(5 * time.Second):
			t.Fatalf("no leader %q observed", want)
		}
		return deadbolt.LeaderInfo{}
	}
	if info := next("10.0.0.7:8080"); info.Term != one.Term() {
		t.Fatalf("observed term %d, want %d", info.Term, one.Term())
	}
	if err := one.Proclaim(ctx, "10.0.0.7:9090"); err != nil {
		t.Fatal(err)
	}
	next("10.0.0.7:9090")
	second := make(chan *deadbolt.Leadership, 1)
	go func() {
		l, err := client.Campaign(ctx, "go/election", "10.0.0.8:8080")
		if err != nil {
			t.Error(err)
		}
		second <- l
	}()
	waitUntil(t, "a candidate", 5*time.Second, func() bool {
		leader, err := client.Leader(ctx, "go/election")
		return err == nil && leader != nil && len(leader.Candidates) == 1
	})
	if err := one.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	two := <-second
	if info := next("10.0.0.8:8080"); two == nil || info.Term != two.Term() || two.Term() <= one.Term() {
		t.Fatalf("second term %+v", info)
	}
	if err := one.Proclaim(ctx, "stale"); err == nil {
		t.Fatal("a resigned leader proclaimed")
	}
	_ = two.Resign(ctx)
}

func TestWatchAndFencedStore(t *testing.T) {
	client := connect(t)
	ctx := within(t, 20*time.Second)
	start, err := client.Status(ctx, "go/watched/a")
	if err != nil || start != nil {
		t.Fatal(start, err)
	}
	guard, err := client.Lock(ctx, "go/watched/a")
	if err != nil {
		t.Fatal(err)
	}
	fence, err := client.Put(ctx, "go/key", "41", guard.Token(), "go/watched/a")
	if err != nil || fence != guard.Token() {
		t.Fatalf("put: %d %v", fence, err)
	}
	if _, err := client.Put(ctx, "go/key", "40", guard.Token()-1, ""); !errors.Is(err, deadbolt.ErrStaleToken) {
		t.Fatalf("a stale put: %v", err)
	}
	stored, err := client.Get(ctx, "go/key", 0, "")
	if err != nil || !stored.Found || stored.Value != "41" || stored.Fence != guard.Token() {
		t.Fatalf("get: %+v %v", stored, err)
	}
	if err := guard.Release(ctx); err != nil {
		t.Fatal(err)
	}
	existed, err := client.Delete(ctx, "go/key", guard.Token())
	if err != nil || !existed {
		t.Fatalf("delete: %v %v", existed, err)
	}
	w := client.Watch("go/watched/", deadbolt.WatchPrefix(), deadbolt.WatchAfterIndex(1))
	var kinds []string
	for len(kinds) < 2 && w.Next(ctx) {
		if w.Event().Name == "go/watched/a" {
			kinds = append(kinds, w.Event().Kind)
		}
	}
	if w.Err() != nil || len(kinds) != 2 || kinds[0] != "granted" || (kinds[1] != "released" && kinds[1] != "closed") {
		t.Fatalf("watched %v, %v", kinds, w.Err())
	}
	// Resumable: a new watcher after the cursor sees what follows only.
	cursor := w.Cursor()
	again, err := client.Lock(ctx, "go/watched/a")
	if err != nil {
		t.Fatal(err)
	}
	_ = again.Release(ctx)
	resumed := client.Watch("go/watched/", deadbolt.WatchPrefix(), deadbolt.WatchAfter(cursor))
	if !resumed.Next(ctx) || resumed.Event().Kind != "granted" || resumed.Event().Token != again.Token() {
		t.Fatalf("resumed at %+v, %v", resumed.Event(), resumed.Err())
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	quiet := client.Watch("go/watched/nothing")
	if quiet.Next(short) || !errors.Is(quiet.Err(), context.DeadlineExceeded) {
		t.Fatalf("a quiet watch: %v", quiet.Err())
	}
	history, err := client.History(ctx, "go/watched/a")
	if err != nil || len(history) < 4 {
		t.Fatalf("history %+v %v", history, err)
	}
	if _, err := client.Locks(ctx); err != nil {
		t.Fatal(err)
	}
}
