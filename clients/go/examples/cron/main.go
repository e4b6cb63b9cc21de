// Command cron is a cron job that runs on one host only: every host runs
// it on the same schedule, whichever takes the lock does the work, and the
// others skip it. The work gets the guard's context, so it stops if the
// lock can no longer be trusted, and the fencing token, for the resource
// to check.
//
//	go run ./examples/cron -endpoint http://127.0.0.1:7070
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	deadbolt "github.com/deadbolt/deadbolt-go"
)

func main() {
	endpoint := flag.String("endpoint", os.Getenv("DEADBOLT_ENDPOINT"), "Deadbolt server(s), comma-separated")
	lock := flag.String("lock", "cron/nightly-report", "the lock of the job")
	flag.Parse()

	client, err := deadbolt.New(*endpoint, deadbolt.FromEnvironment())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	guard, err := client.TryLock(ctx, *lock, deadbolt.WithTTL(15*time.Second))
	if errors.Is(err, deadbolt.ErrBusy) {
		fmt.Println("another host is sending the report: skipping")
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer guard.Release(context.Background())

	if err := sendReport(guard.Context(), guard.Token()); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("report sent under token %d\n", guard.Token())
}

// sendReport stands for the job: it checks ctx between steps, and passes
// the token on to whatever it writes.
func sendReport(ctx context.Context, token uint64) error {
	for step := 0; step < 3; step++ {
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped: the lock can no longer be trusted (%w)", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}
