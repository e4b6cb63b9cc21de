// Command leader runs for leader of an election with its address as the
// value, works only while it leads, and steps down on SIGINT; every
// instance also prints who leads, as Observe reports it.
//
//	go run ./examples/leader -value 10.0.0.7:8080   # in two terminals
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"time"

	deadbolt "github.com/deadbolt/deadbolt-go"
)

func main() {
	endpoint := flag.String("endpoint", os.Getenv("DEADBOLT_ENDPOINT"), "Deadbolt server(s), comma-separated")
	election := flag.String("election", "scheduler", "the election")
	value := flag.String("value", fmt.Sprintf("pid %d", os.Getpid()), "what this instance proclaims (its address)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	client, err := deadbolt.New(*endpoint, deadbolt.FromEnvironment())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	go func() {
		for leader := range client.Observe(ctx, *election) {
			if leader.SessionID == 0 {
				fmt.Println("observed: nobody leads")
			} else {
				fmt.Printf("observed: %q leads in term %d\n", leader.Value, leader.Term)
			}
		}
	}()

	for ctx.Err() == nil {
		// Waits behind the leader and earlier candidates, in FIFO order.
		leadership, err := client.Campaign(ctx, *election, *value, deadbolt.WithTTL(10*time.Second))
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			log.Printf("campaign: %v; trying again", err)
			time.Sleep(time.Second)
			continue
		}
		fmt.Printf("leading in term %d\n", leadership.Term())
		// Until the leadership can no longer be trusted, or SIGINT.
		work, cancel := leadership.Bind(ctx)
		lead(work, leadership.Term())
		cancel()
		if err := leadership.Err(); err != nil && ctx.Err() == nil {
			log.Printf("leadership lost: %v", err)
		}
		resign, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = leadership.Resign(resign)
		cancel()
	}
}

// lead does the leader's work until ctx ends: the leadership can no
// longer be trusted, or it resigned. The term is a fencing token: pass it
// to whatever the leader writes.
func lead(ctx context.Context, term uint64) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			fmt.Printf("  scheduling, term %d\n", term)
		}
	}
}
