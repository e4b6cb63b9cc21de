// Command conformance-driver is the Go client's driver for the client
// conformance suite (crates/conformance/README.md): JSON commands on
// stdin, one per line, each run in a goroutine of its own through the
// public API of package deadbolt, each answered on stdout by id. It exits
// when stdin closes.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	deadbolt "github.com/deadbolt/deadbolt-go"
)

type command struct {
	ID        uint64   `json:"id"`
	Op        string   `json:"op"`
	Endpoints []string `json:"endpoints"`
	CA        *string  `json:"ca"`
	Cert      *string  `json:"cert"`
	Key       *string  `json:"key"`
	Token     *string  `json:"token"`
	TTLMs     uint64   `json:"ttl_ms"`
	Session   uint64   `json:"session"`
	Name      string   `json:"name"`
	TimeoutMs *uint64  `json:"timeout_ms"`
	MarginMs  uint64   `json:"margin_ms"`
	SessionID uint64   `json:"session_id"`
	Secret    string   `json:"secret"`
}

type refusal struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

type answer struct {
	ID uint64 `json:"id"`
	OK any    `json:"ok"`
}

type failed struct {
	ID    uint64  `json:"id"`
	Error refusal `json:"error"`
}

type key struct {
	session uint64
	name    string
}

type driver struct {
	mu       sync.Mutex
	client   *deadbolt.Client
	sessions map[uint64]*deadbolt.Session
	guards   map[key]*deadbolt.Guard
	out      *json.Encoder
	outMu    sync.Mutex
}

type obj = map[string]any

func invalid(format string, args ...any) error {
	return &deadbolt.Error{Kind: deadbolt.KindInvalidArgument, Message: fmt.Sprintf(format, args...)}
}

func (d *driver) session(id uint64) (*deadbolt.Session, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.sessions[id]
	if s == nil {
		return nil, invalid("no session %d here", id)
	}
	return s, nil
}

func (d *driver) granted(g *deadbolt.Guard, err error) (any, error) {
	if errors.Is(err, deadbolt.ErrBusy) {
		return obj{"token": nil}, nil
	}
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.guards[key{g.Session().ID(), g.Name()}] = g
	d.mu.Unlock()
	return obj{"token": g.Token()}, nil
}

func (d *driver) run(c command) (any, error) {
	ctx := context.Background()
	if c.Op == "connect" {
		var opts []deadbolt.Option
		if c.CA != nil {
			opts = append(opts, deadbolt.WithCAFile(*c.CA))
		}
		if c.Cert != nil && c.Key != nil {
			opts = append(opts, deadbolt.WithClientCertificate(*c.Cert, *c.Key))
		}
		if c.Token != nil {
			opts = append(opts, deadbolt.WithAccessToken(*c.Token))
		}
		client, err := deadbolt.New(c.Endpoints, opts...)
		if err != nil {
			return nil, err
		}
		d.mu.Lock()
		d.client = client
		d.mu.Unlock()
		return obj{}, nil
	}
	d.mu.Lock()
	client := d.client
	d.mu.Unlock()
	if client == nil {
		return nil, invalid("connect first")
	}
	switch c.Op {
	case "open":
		s, err := client.NewSession(ctx, deadbolt.WithTTL(time.Duration(c.TTLMs)*time.Millisecond))
		if err != nil {
			return nil, err
		}
		d.mu.Lock()
		d.sessions[s.ID()] = s
		d.mu.Unlock()
		return obj{"session": s.ID()}, nil
	case "lock":
		s, err := d.session(c.Session)
		if err != nil {
			return nil, err
		}
		if c.TimeoutMs != nil {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, time.Duration(*c.TimeoutMs)*time.Millisecond)
			defer cancel()
		}
		return d.granted(s.Lock(ctx, c.Name))
	case "try_lock":
		s, err := d.session(c.Session)
		if err != nil {
			return nil, err
		}
		return d.granted(s.TryLock(ctx, c.Name))
	case "release":
		d.mu.Lock()
		g := d.guards[key{c.Session, c.Name}]
		delete(d.guards, key{c.Session, c.Name})
		d.mu.Unlock()
		if g == nil {
			return nil, invalid("(%d, %q) is not held here", c.Session, c.Name)
		}
		return obj{}, g.Release(ctx)
	case "lost":
		s, err := d.session(c.Session)
		if err != nil {
			return nil, err
		}
		reason := s.WaitLost(ctx, time.Duration(c.MarginMs)*time.Millisecond)
		switch {
		case errors.Is(reason, deadbolt.ErrSessionClosed):
			return obj{"reason": "closed"}, nil
		case errors.Is(reason, deadbolt.ErrExpired):
			return obj{"reason": "expired"}, nil
		}
		return obj{"reason": "rejected"}, nil
	case "close":
		d.mu.Lock()
		s := d.sessions[c.Session]
		delete(d.sessions, c.Session)
		d.mu.Unlock()
		if s == nil {
			return nil, invalid("no session %d here", c.Session)
		}
		return obj{}, s.Close(ctx)
	case "status":
		status, err := client.Status(ctx, c.Name)
		if err != nil {
			return nil, err
		}
		if status == nil {
			return obj{"holder": nil, "token": nil, "waiters": []uint64{}}, nil
		}
		waiters := status.Waiters
		if waiters == nil {
			waiters = []uint64{}
		}
		return obj{"holder": status.Holder, "token": status.Token, "waiters": waiters}, nil
	case "handle":
		s, err := d.session(c.Session)
		if err != nil {
			return nil, err
		}
		h := s.Handle()
		return obj{"session_id": h.ID, "secret": h.Secret}, nil
	case "keep_alive_handle":
		ttl, err := client.KeepAlive(ctx, deadbolt.SessionHandle{ID: c.SessionID, Secret: c.Secret})
		if err != nil {
			return nil, err
		}
		return obj{"ttl_ms": ttl.Milliseconds()}, nil
	}
	return nil, invalid("unknown op %q", c.Op)
}

func (d *driver) answer(c command) {
	var reply any
	ok, err := d.run(c)
	if err != nil {
		var failure *deadbolt.Error
		if errors.As(err, &failure) {
			reply = failed{c.ID, refusal{string(failure.Kind), failure.Message}}
		} else {
			reply = failed{c.ID, refusal{"driver", err.Error()}}
		}
	} else {
		reply = answer{c.ID, ok}
	}
	d.outMu.Lock()
	defer d.outMu.Unlock()
	if err := d.out.Encode(reply); err != nil {
		fmt.Fprintln(os.Stderr, "conformance-driver: cannot write an answer:", err)
	}
}

func main() {
	d := &driver{
		sessions: map[uint64]*deadbolt.Session{},
		guards:   map[key]*deadbolt.Guard{},
		out:      json.NewEncoder(os.Stdout),
	}
	lines := bufio.NewScanner(os.Stdin)
	lines.Buffer(make([]byte, 1<<20), 1<<20)
	for lines.Scan() {
		line := lines.Bytes()
		if len(line) == 0 {
			continue
		}
		var c command
		if err := json.Unmarshal(line, &c); err != nil {
			fmt.Fprintf(os.Stderr, "conformance-driver: not a command: %s (%v)\n", line, err)
			continue
		}
		go d.answer(c)
	}
}
