package deadbolt_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	deadbolt "github.com/deadbolt/deadbolt-go"
)

func cpuTime() time.Duration {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	return time.Duration(usage.Utime.Nano() + usage.Stime.Nano())
}

// BenchmarkAcquireRelease is acquire+release pairs from 16 and 64
// goroutines against one server, each goroutine in a session of its own on
// a lock of its own (as scripts/client-bench.sh measures the other
// clients). It reports pairs/s and this process's CPU per pair (the server
// is another process):
//
//	go test -run '^$' -bench AcquireRelease -benchtime 5s
//
// With DEADBOLT_BENCH_ENDPOINT, against that server instead of a
// throwaway one (to compare with `deadbolt bench uncontended` there).
func BenchmarkAcquireRelease(b *testing.B) {
	for _, goroutines := range []int{16, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", goroutines), func(b *testing.B) {
			client := benchClient(b)
			ctx := context.Background()
			sessions := make([]*deadbolt.Session, goroutines)
			for i := range sessions {
				sessions[i] = session(b, client)
			}
			var done int64
			var failures int64
			var wg sync.WaitGroup
			b.ResetTimer()
			started, cpu := time.Now(), cpuTime()
			for i, s := range sessions {
				wg.Add(1)
				go func(i int, s *deadbolt.Session) {
					defer wg.Done()
					name := fmt.Sprintf("go/bench/%d", i)
					for atomic.AddInt64(&done, 1) <= int64(b.N) {
						g, err := s.Lock(ctx, name)
						if err == nil {
							err = g.Release(ctx)
						}
						if err != nil {
							atomic.AddInt64(&failures, 1)
							b.Error(err)
							return
						}
					}
				}(i, s)
			}
			wg.Wait()
			elapsed, used := time.Since(started), cpuTime()-cpu
			b.StopTimer()
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "pairs/s")
			b.ReportMetric(float64(used.Microseconds())/float64(b.N), "client-cpu-µs/pair")
			if failures > 0 {
				b.Fatalf("%d failures", failures)
			}
		})
	}
}

func benchClient(b *testing.B) *deadbolt.Client {
	if endpoint := os.Getenv("DEADBOLT_BENCH_ENDPOINT"); endpoint != "" {
		return connectTo(b, endpoint)
	}
	return connect(b)
}
