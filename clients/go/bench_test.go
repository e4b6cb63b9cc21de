package deadbolt_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	deadbolt "github.com/deadbolt/deadbolt-go"
	"github.com/deadbolt/deadbolt-go/internal/pairs"
)

// BenchmarkAcquireRelease is b.N acquire+release pairs from 16 and 64
// goroutines against one server, each goroutine in a session of its own on
// a lock of its own (internal/pairs). It reports pairs/s and this
// process's CPU per pair (the server is another process):
//
//	go test -run '^$' -bench AcquireRelease -benchtime 20000x -cpuprofile cpu.out
//
// With DEADBOLT_BENCH_ENDPOINT, against that server instead of a throwaway
// one. To compare with the Rust client side by side, cmd/bench prints
// `deadbolt bench uncontended`'s line.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, goroutines := range []int{16, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", goroutines), func(b *testing.B) {
			client := benchClient(b)
			load := pairs.Load{Goroutines: goroutines, Duration: 1 << 62, Pairs: int64(b.N)}
			b.ResetTimer()
			result, err := pairs.Run(context.Background(), client, fmt.Sprintf("go/bench/%d", goroutines), load)
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(result.PerSecond(), "pairs/s")
			b.ReportMetric(float64(result.CPUPerPair().Nanoseconds())/1e3, "client-cpu-µs/pair")
		})
	}
}

func benchClient(b *testing.B) *deadbolt.Client {
	if endpoint := os.Getenv("DEADBOLT_BENCH_ENDPOINT"); endpoint != "" {
		return connectTo(b, endpoint)
	}
	return connect(b)
}
