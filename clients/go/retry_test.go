package deadbolt

// How calls move between nodes and what a repeated change reports, against
// stand-in servers (httptest) that answer what a real one answers only in
// a failover: a forwarded answer's leader hint, a connection cut after the
// request went out, a forwarding node that lost its leader.

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// standIn is a server whose every answer is answer's, with count the
// number of calls so far (1 for the first).
func standIn(t *testing.T, answer func(w http.ResponseWriter, count int64)) *httptest.Server {
	var calls int64
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		answer(w, atomic.AddInt64(&calls, 1))
	}))
	t.Cleanup(server.Close)
	return server
}

func answerWith(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

// cutOff closes the connection once the request has arrived, answering
// nothing: the caller cannot tell whether it was done.
func cutOff(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		conn.Close()
	}
}

func standInClient(t *testing.T, endpoints ...string) *Client {
	client, err := New(endpoints, WithCallTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

const staleAnswer = `{"error":{"kind":"stale_token","message":"stale token: key \"k\" is fenced at 9, not 7"}}`

// A fenced put whose first attempt may have been done, refused as stale on
// repeat, reports the outcome unknown: the first attempt may have written
// before a newer holder fenced the key. A first attempt that certainly did
// nothing leaves the refusal as it is.
func TestRefusedRepeatAfterUnknownOutcome(t *testing.T) {
	cases := []struct {
		name    string
		first   func(w http.ResponseWriter)
		unknown bool
	}{
		{"the connection broke after sending", cutOff, true},
		{"a forwarding node lost the leader", func(w http.ResponseWriter) {
			answerWith(w, 503, `{"error":{"kind":"unavailable","message":"lost the leader while forwarding: the call may or may not have been done"}}`)
		}, true},
		{"a follower refused it", func(w http.ResponseWriter) {
			answerWith(w, 503, `{"error":{"kind":"not_leader","message":"this node is not the leader"}}`)
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			server := standIn(t, func(w http.ResponseWriter, count int64) {
				if count == 1 {
					c.first(w)
					return
				}
				answerWith(w, 409, staleAnswer)
			})
			_, err := standInClient(t, server.URL).Put(context.Background(), "k", "v", 7, "")
			var failure *Error
			if !errors.As(err, &failure) {
				t.Fatalf("not an *Error: %v", err)
			}
			if !c.unknown {
				if !errors.Is(err, ErrStaleToken) || failure.OutcomeUnknown() {
					t.Fatalf("a repeat of a call that did nothing: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrStaleToken) || !failure.OutcomeUnknown() ||
				failure.HadNoEffect() || !strings.Contains(err.Error(), "may have been") {
				t.Fatalf("want an unknown outcome, not the refusal: %v", err)
			}
		})
	}
}

// A node that forwarded a call names the leader; later calls go there. Once
// that leader cannot be connected to, calls go back to the endpoints given
// and hints are followed no more (a load balancer in front, say), while a
// not_leader answer naming one still is.
func TestFollowsTheLeaderHint(t *testing.T) {
	var leaderCalls int64
	leader := standIn(t, func(w http.ResponseWriter, count int64) {
		atomic.StoreInt64(&leaderCalls, count)
		answerWith(w, 200, `{"state":null,"index":1}`)
	})
	hintedAddress := strings.TrimPrefix(leader.URL, "http://")
	forwarder := standIn(t, func(w http.ResponseWriter, count int64) {
		w.Header().Set("Deadbolt-Leader", hintedAddress)
		answerWith(w, 200, `{"state":null,"index":1}`)
	})
	client := standInClient(t, forwarder.URL)
	ctx := context.Background()
	status := func() {
		t.Helper()
		if _, err := client.Status(ctx, "x"); err != nil {
			t.Fatal(err)
		}
	}

	status()
	if got := client.Endpoints()[0]; got != leader.URL {
		t.Fatalf("after a hint naming %s, calls go to %s", leader.URL, got)
	}
	status()
	if atomic.LoadInt64(&leaderCalls) != 1 {
		t.Fatalf("the leader named got %d calls, not 1", leaderCalls)
	}

	leader.Close()
	status()
	status()
	if got := client.Endpoints(); got[0] != forwarder.URL || len(got) != 1 {
		t.Fatalf("with the hinted leader unreachable, calls go to %v", got)
	}

	plain := standIn(t, func(w http.ResponseWriter, count int64) { answerWith(w, 200, `{"state":null,"index":1}`) })
	redirect := standIn(t, func(w http.ResponseWriter, count int64) {
		answerWith(w, 503, `{"error":{"kind":"not_leader","leader":"`+strings.TrimPrefix(plain.URL, "http://")+`","message":"not the leader"}}`)
	})
	named := standInClient(t, redirect.URL)
	if _, err := named.Status(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if got := named.Endpoints(); got[0] != plain.URL || got[1] != redirect.URL {
		t.Fatalf("after not_leader naming %s, calls go to %v", plain.URL, got)
	}
}

// Through a failover, repeats are at most failoverCap apart; an
// overloaded leader's refusals are spaced up to backoffCap.
func TestBackoffCaps(t *testing.T) {
	var failover, overload backoff
	notLeader := newError(KindNotLeader, "no leader yet")
	overloaded := newError(KindOverloaded, "the queue is full")
	longest := time.Duration(0)
	for i := 0; i < 40; i++ {
		if d := failover.next(notLeader); d > failoverCap {
			t.Fatalf("a failover's repeat %d after %v, over %v", i, d, failoverCap)
		}
		if d := overload.next(overloaded); d > longest {
			longest = d
		}
	}
	if longest <= failoverCap || longest > backoffCap {
		t.Fatalf("an overloaded leader's repeats at most %v apart, want (%v, %v]", longest, failoverCap, backoffCap)
	}
}
