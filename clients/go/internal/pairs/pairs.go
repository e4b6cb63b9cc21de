// Package pairs measures acquire+release pairs against one server as
// `deadbolt bench uncontended` measures the Rust client, so that the two
// figures compare: every goroutine has a session of its own (TTL 10 s) and
// loops acquire → release on a lock of its own; pairs are counted after a
// warm-up, with this process's CPU over the same span (the server is
// another process). The benchmark (bench_test.go) and cmd/bench share it.
// With Load.ClientLock the goroutines take their locks as the README
// shows, client.Lock then guard.Release, the figure the Python and
// TypeScript clients' benches give beside redis-py's and node-redlock's.
package pairs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	deadbolt "github.com/deadbolt/deadbolt-go"
)

// Load is what to run: Goroutines loops, counted after Warmup for
// Duration, or until Pairs have been counted if that comes first (0: no
// such limit).
type Load struct {
	Goroutines int
	Warmup     time.Duration
	Duration   time.Duration
	Pairs      int64
	// ClientLock: each pair is client.Lock (TTL 10 s, and LockOptions)
	// then guard.Release, in the client's shared session unless
	// LockOptions has deadbolt.WithOwnSession, instead of a Lock and
	// Release in a session of the goroutine's own.
	ClientLock  bool
	LockOptions []deadbolt.LockOption
}

// Result is what a Load did while it was counted.
type Result struct {
	Goroutines int
	Pairs      int64
	Elapsed    time.Duration
	// CPU is this process's (user and system), or 0 where unknown.
	CPU time.Duration
}

// PerSecond is pairs per second.
func (r Result) PerSecond() float64 { return float64(r.Pairs) / r.Elapsed.Seconds() }

// CPUPerPair is the client's CPU per pair.
func (r Result) CPUPerPair() time.Duration {
	if r.Pairs == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.Pairs)
}

// String is one line, worded as `deadbolt bench uncontended`'s.
func (r Result) String() string {
	return fmt.Sprintf("uncontended: %d goroutines, %.1fs: %.0f acquire+release pairs/s, %.1f µs client CPU/pair",
		r.Goroutines, r.Elapsed.Seconds(), r.PerSecond(), float64(r.CPUPerPair().Nanoseconds())/1e3)
}

// Run runs load through client, on locks named prefix/0, prefix/1, ...
func Run(ctx context.Context, client *deadbolt.Client, prefix string, load Load) (Result, error) {
	sessions := make([]*deadbolt.Session, load.Goroutines)
	defer func() {
		for _, s := range sessions {
			if s != nil {
				_ = s.Close(context.Background())
			}
		}
	}()
	// With ClientLock, client.Lock chooses the sessions, and these stay nil.
	for i := 0; i < len(sessions) && !load.ClientLock; i++ {
		s, err := client.NewSession(ctx, deadbolt.WithTTL(10*time.Second))
		if err != nil {
			return Result{}, err
		}
		sessions[i] = s
	}
	var (
		counting, stop int32
		counted        int64
		wg             sync.WaitGroup
		failure        error
		mu             sync.Mutex
		once           sync.Once
	)
	// enough is closed once the pairs asked for are counted, or on the
	// first failure.
	enough := make(chan struct{})
	done := func(err error) {
		if err != nil {
			mu.Lock()
			if failure == nil {
				failure = err
			}
			mu.Unlock()
		}
		once.Do(func() { close(enough) })
	}
	options := append([]deadbolt.LockOption{deadbolt.WithTTL(10 * time.Second)}, load.LockOptions...)
	for i, s := range sessions {
		wg.Add(1)
		go func(name string, s *deadbolt.Session) {
			defer wg.Done()
			for atomic.LoadInt32(&stop) == 0 {
				var g *deadbolt.Guard
				var err error
				if s == nil {
					g, err = client.Lock(ctx, name, options...)
				} else {
					g, err = s.Lock(ctx, name)
				}
				if err == nil {
					err = g.Release(ctx)
				}
				if err != nil {
					done(err)
					return
				}
				if atomic.LoadInt32(&counting) == 1 && atomic.AddInt64(&counted, 1) == load.Pairs {
					done(nil)
				}
			}
		}(fmt.Sprintf("%s/%d", prefix, i), s)
	}
	time.Sleep(load.Warmup)
	cpu, started := cpuTime(), time.Now()
	atomic.StoreInt32(&counting, 1)
	timer := time.NewTimer(load.Duration)
	select {
	case <-timer.C:
	case <-enough:
		timer.Stop()
	}
	atomic.StoreInt32(&counting, 0)
	result := Result{
		Goroutines: load.Goroutines,
		Pairs:      atomic.LoadInt64(&counted),
		Elapsed:    time.Since(started),
		CPU:        cpuTime() - cpu,
	}
	atomic.StoreInt32(&stop, 1)
	wg.Wait()
	return result, failure
}
