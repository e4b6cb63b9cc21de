package deadbolt_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	deadbolt "github.com/deadbolt/deadbolt-go"
	"github.com/deadbolt/deadbolt-go/internal/testserver"
)

// TestLeaderKill is the conformance suite's leader_kill with real
// processes: three nodes; the leader is SIGKILLed while one client holds
// a lock and another, given only a follower's address, waits for it. The
// holder keeps it, its release goes through the new leader, and the
// waiter's cut acquire, repeated, is granted exactly once. Meanwhile a
// third client takes and releases locks in a loop: it sees no error.
func TestLeaderKill(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3-node cluster")
	}
	cluster := testserver.StartCluster(t, 3)
	leader := cluster.Leader(t, 10*time.Second)
	follower := cluster.Nodes[(leader+1)%3].Endpoint
	ctx := within(t, 40*time.Second)
	holders := connectTo(t, cluster.Endpoints()...)
	waiters := connectTo(t, follower)
	holder := session(t, holders, deadbolt.WithTTL(10*time.Second))
	held, err := holder.Lock(ctx, "go/failover")
	if err != nil {
		t.Fatal(err)
	}
	waiter := session(t, waiters, deadbolt.WithTTL(10*time.Second))
	granted := make(chan *deadbolt.Guard, 1)
	go func() {
		g, err := waiter.Lock(ctx, "go/failover")
		if err != nil {
			t.Errorf("the waiter: %v", err)
		}
		granted <- g
	}()
	waitUntil(t, "queued", 10*time.Second, func() bool { return queued(t, holders, "go/failover", waiter.ID()) })

	// A client busy taking and releasing locks through it all.
	var pairs, failures int64
	var lastErr atomic.Value
	stop := make(chan struct{})
	var busy sync.WaitGroup
	busy.Add(1)
	go func() {
		defer busy.Done()
		s := session(t, holders, deadbolt.WithTTL(5*time.Second))
		for {
			select {
			case <-stop:
				return
			default:
			}
			call, cancel := context.WithTimeout(ctx, 10*time.Second)
			g, err := s.Lock(call, "go/failover/busy")
			if err == nil {
				err = g.Release(call)
			}
			cancel()
			if err != nil {
				atomic.AddInt64(&failures, 1)
				lastErr.Store(err)
				return
			}
			atomic.AddInt64(&pairs, 1)
		}
	}()
	time.Sleep(200 * time.Millisecond)

	cluster.Nodes[leader].Kill()
	killed := time.Now()
	next := cluster.Leader(t, 30*time.Second)
	if next == leader {
		t.Fatal("the killed node still leads")
	}
	before := atomic.LoadInt64(&pairs)
	waitUntil(t, "a grant after the kill", 10*time.Second, func() bool { return atomic.LoadInt64(&pairs) > before+1 })
	t.Logf("the busy client's next grant came %v after the kill", time.Since(killed).Round(time.Millisecond))
	waitUntil(t, "queued again", 10*time.Second, func() bool { return queued(t, holders, "go/failover", waiter.ID()) })
	select {
	case <-held.Done():
		t.Fatalf("the holder's lease was lost across the leader change: %v", held.Err())
	default:
	}
	status, err := holders.Status(ctx, "go/failover")
	if err != nil || status == nil || status.Holder != holder.ID() || status.Token != held.Token() {
		t.Fatalf("after the leader change: %+v %v", status, err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	g := <-granted
	if g == nil {
		t.FailNow()
	}
	if g.Token() <= held.Token() {
		t.Fatalf("the waiter's token %d is not above %d", g.Token(), held.Token())
	}
	status, err = waiters.Status(ctx, "go/failover")
	if err != nil || status == nil || status.Holder != waiter.ID() || len(status.Waiters) != 0 {
		t.Fatalf("the repeated acquire left %+v %v", status, err)
	}
	if err := g.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if status, err := waiters.Status(ctx, "go/failover"); err != nil || status != nil {
		t.Fatalf("a second grant from the repeated acquire: %+v %v", status, err)
	}
	close(stop)
	busy.Wait()
	if failures > 0 {
		err, _ := lastErr.Load().(error)
		t.Fatalf("the busy client saw an error through the failover: %v (had no effect: %v, lost: %v)",
			err, deadbolt.HadNoEffect(err), errors.Is(err, deadbolt.ErrLost))
	}
	t.Logf("%d pairs through the failover", pairs)
}
