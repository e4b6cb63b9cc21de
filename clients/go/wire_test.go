package deadbolt

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// A kept connection the server closed while it sat idle is not an outage:
// a call sent on it goes again on a new one, once; and one idle for more
// than checkIdleAfter is looked at before it is used, so that even a call
// that is not sent twice (a raw keepalive) goes through.
func TestKeptConnectionClosedByTheServer(t *testing.T) {
	var calls int64
	server := standIn(t, func(w http.ResponseWriter, count int64) {
		atomic.StoreInt64(&calls, count)
		answerWith(w, 200, `{"state":null,"index":1,"ttl_ms":1000}`)
	})
	client := standInClient(t, server.URL)
	ctx := context.Background()
	if _, err := client.Status(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	server.CloseClientConnections()
	if _, err := client.Status(ctx, "x"); err != nil {
		t.Fatalf("on a kept connection the server had closed: %v", err)
	}
	server.CloseClientConnections()
	time.Sleep(10 * checkIdleAfter)
	if _, err := client.KeepAlive(ctx, SessionHandle{1, "s"}); err != nil {
		t.Fatalf("a raw keepalive on a kept connection the server had closed: %v", err)
	}
	if n := atomic.LoadInt64(&calls); n != 3 {
		t.Fatalf("the server got %d calls, not 3", n)
	}
}

// A call that waits for its answer ends as soon as its context is
// cancelled (once watchAfter has passed, a goroutine watches for it), and
// the next call goes through.
func TestCancelCutsACallShort(t *testing.T) {
	var calls int64
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if atomic.AddInt64(&calls, 1) == 1 {
			<-r.Context().Done() // the client went away
			return
		}
		answerWith(w, 200, `{"state":null,"index":1}`)
	}))
	t.Cleanup(server.Close)
	client := standInClient(t, server.URL)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	started := time.Now()
	_, err := client.Status(ctx, "x")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled call: %v", err)
	}
	if took := time.Since(started); took > time.Second {
		t.Fatalf("the cancel took %v to end the call", took)
	}
	if _, err := client.Status(context.Background(), "x"); err != nil {
		t.Fatalf("the next call: %v", err)
	}
}

// A server that does not speak framed calls (here one that speaks only
// HTTP, and answers the preface 400) gets the calls over HTTP: framed
// calls are tried by default, and the refusal is remembered.
func TestFramedCallsFallBackToHTTP(t *testing.T) {
	server := standIn(t, func(w http.ResponseWriter, count int64) {
		answerWith(w, 200, `{"ttl_ms":1000}`)
	})
	client, err := New(server.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	for i := 0; i < 2; i++ {
		if ttl, err := client.KeepAlive(context.Background(), SessionHandle{1, "s"}); err != nil || ttl != time.Second {
			t.Fatalf("a keepalive to an HTTP-only server: %v %v", ttl, err)
		}
	}
	if !client.framing.refusing(server.URL[len("http://"):]) {
		t.Fatal("the refusal is not remembered")
	}
}

// WithFramedCalls(false) keeps every call on HTTP/1.1: no framed
// connection is tried, so the stand-in sees only HTTP requests.
func TestFramedCallsTurnedOff(t *testing.T) {
	server := standIn(t, func(w http.ResponseWriter, count int64) {
		answerWith(w, 200, `{"ttl_ms":1000}`)
	})
	client, err := New(server.URL, WithFramedCalls(false))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if client.framing != nil {
		t.Fatal("framed calls are on")
	}
	if ttl, err := client.KeepAlive(context.Background(), SessionHandle{1, "s"}); err != nil || ttl != time.Second {
		t.Fatalf("a keepalive over HTTP: %v %v", ttl, err)
	}
}
