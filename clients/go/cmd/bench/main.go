// Command bench measures the Go client's acquire+release pairs/s against
// one server, and its CPU per pair, in the terms of the Rust client's
// `deadbolt bench uncontended`, so that the two can run side by side on the
// same server and compare line for line (see internal/pairs):
//
//	go run ./cmd/bench --endpoint http://127.0.0.1:7070 --clients 16 --duration 5s
//	uncontended: 16 goroutines, 5.0s: 8780 acquire+release pairs/s, 61.2 µs client CPU/pair
//
// --client-lock takes the locks as the README shows, client.Lock then
// guard.Release (with --own-session, a session per lock).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	deadbolt "github.com/deadbolt/deadbolt-go"
	"github.com/deadbolt/deadbolt-go/internal/pairs"
)

func main() {
	endpoint := flag.String("endpoint", os.Getenv("DEADBOLT_ENDPOINT"), "the server (default $DEADBOLT_ENDPOINT, else "+deadbolt.DefaultEndpoint+")")
	clients := flag.Int("clients", 16, "goroutines, each with a session and a lock of its own")
	duration := flag.Duration("duration", 10*time.Second, "how long to count pairs")
	warmup := flag.Duration("warmup", time.Second, "how long to run before counting")
	framed := flag.Bool("framed", true, "acquire, release and keepalive as framed calls; --framed=false: HTTP/1.1 throughout (deadbolt.WithFramedCalls)")
	clientLock := flag.Bool("client-lock", false, "client.Lock then guard.Release, in the client's shared session, instead of a session per goroutine")
	ownSession := flag.Bool("own-session", false, "with --client-lock: a session per lock (deadbolt.WithOwnSession)")
	flag.Parse()
	if *clients < 1 {
		fmt.Fprintln(os.Stderr, "bench: --clients must be at least 1")
		os.Exit(2)
	}
	opts := []deadbolt.Option{deadbolt.FromEnvironment(), deadbolt.WithFramedCalls(*framed)}
	client, err := deadbolt.New(*endpoint, opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	defer client.Close()
	load := pairs.Load{Goroutines: *clients, Warmup: *warmup, Duration: *duration, ClientLock: *clientLock}
	if *ownSession {
		load.LockOptions = append(load.LockOptions, deadbolt.WithOwnSession())
	}
	result, err := pairs.Run(context.Background(), client, fmt.Sprintf("bench:go:%d", os.Getpid()), load)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	fmt.Println(result)
}
