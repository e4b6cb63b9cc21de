// Command fencedwrite shows what the fencing token is for. A storage
// service behind fence.Middleware keeps the highest token it accepted;
// holder A takes the lock, stalls past its lease (as a long GC pause or a
// suspended VM would), and holder B is granted the lock. When A wakes up
// and writes, the storage refuses it: 409, stale token. Without the
// check, A would have overwritten B's work.
//
//	go run ./examples/fencedwrite -endpoint http://127.0.0.1:7070
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	deadbolt "github.com/deadbolt/deadbolt-go"
	"github.com/deadbolt/deadbolt-go/fence"
)

func main() {
	endpoint := flag.String("endpoint", os.Getenv("DEADBOLT_ENDPOINT"), "Deadbolt server(s), comma-separated")
	flag.Parse()
	client, err := deadbolt.New(*endpoint, deadbolt.FromEnvironment())
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()

	// The protected resource: a document store that checks tokens.
	var mu sync.Mutex
	document := ""
	storage := httptest.NewServer(fence.Middleware(fence.NewGate(0), http.HandlerFunc(
		func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			document = string(body)
			mu.Unlock()
			token, _ := fence.TokenFrom(r.Context())
			fmt.Fprintf(w, "stored with token %d", token)
		})))
	defer storage.Close()
	write := func(token uint64, text string) {
		req, _ := http.NewRequest(http.MethodPut, storage.URL, strings.NewReader(text))
		fence.SetToken(req, token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		answer, _ := io.ReadAll(resp.Body)
		fmt.Printf("  %q with token %d: %s %s\n", text, token, resp.Status, strings.TrimSpace(string(answer)))
	}

	a, err := client.Lock(ctx, "examples/document", deadbolt.WithTTL(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("A holds the lock with token %d and writes\n", a.Token())
	write(a.Token(), "A's first draft")

	// A stalls, and does not look at a.Done(): stopping the renewals
	// stands for a process too paused to renew.
	fmt.Println("A stalls; its lease runs out ...")
	_ = a.Session().Close(ctx) // the server lets go at once, as it would after the TTL

	b, err := client.Lock(ctx, "examples/document")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("B is granted the lock with token %d and writes\n", b.Token())
	write(b.Token(), "B's final text")

	fmt.Println("A wakes up, still believing it holds the lock, and writes:")
	write(a.Token(), "A's stale draft")
	_ = b.Release(ctx)
	mu.Lock()
	fmt.Printf("the document: %q\n", document)
	mu.Unlock()
}
