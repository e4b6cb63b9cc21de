package deadbolt

import (
	"context"
	"time"
)

// LeaderInfo is an election's leader: its session, its term (a fencing
// token) and the value it proclaims; Candidates queue behind it.
type LeaderInfo struct {
	SessionID  uint64   `json:"session_id"`
	Term       uint64   `json:"term"`
	Value      string   `json:"value"`
	Candidates []uint64 `json:"-"`
	Index      uint64   `json:"-"`
}

// Leader reads who leads the election: nil while nobody does.
func (c *Client) Leader(ctx context.Context, election string) (*LeaderInfo, error) {
	leader, _, err := c.leader(ctx, election)
	return leader, err
}

// leader is Leader and the log index of the read.
func (c *Client) leader(ctx context.Context, election string) (*LeaderInfo, uint64, error) {
	var answer struct {
		Leader     *LeaderInfo `json:"leader"`
		Candidates []uint64    `json:"candidate_session_ids"`
		Index      uint64      `json:"index"`
	}
	if err := c.call(ctx, get("/v1/election/leader", queryOf("election", election)), &answer); err != nil {
		return nil, 0, err
	}
	if answer.Leader != nil {
		answer.Leader.Candidates, answer.Leader.Index = answer.Candidates, answer.Index
	}
	return answer.Leader, answer.Index, nil
}

// Leadership is a won election: a Guard whose token is the term. Releasing
// it (Resign) steps down, and the next candidate in FIFO order leads.
type Leadership struct {
	*Guard
	value string
}

// Term is the leadership's fencing token: larger than every earlier
// term's (and every lock's grant before it).
func (l *Leadership) Term() uint64 { return l.Token() }

// Proclaim changes the leader's value (for everyone who reads Leader or
// Observes). It fails with ErrNotHolder or ErrStaleToken once this term is
// over.
func (l *Leadership) Proclaim(ctx context.Context, value string) error {
	s := l.session
	body := struct {
		SessionID     uint64 `json:"session_id"`
		SessionSecret string `json:"session_secret"`
		Election      string `json:"election"`
		Term          uint64 `json:"term"`
		Value         string `json:"value"`
	}{s.handle.ID, s.handle.Secret, l.Name(), l.Term(), value}
	ctx, cancel := s.client.bounded(ctx)
	defer cancel()
	policy := retryPolicy{lost: s.leaseError, idempotentChange: true}
	err := s.client.retrying(ctx, policy, func(ctx context.Context) error {
		return s.client.send(ctx, post("/v1/election/proclaim", body), nil)
	})
	if err == nil {
		l.value = value
	}
	return err
}

// Resign steps down (Release).
func (l *Leadership) Resign(ctx context.Context) error { return l.Release(ctx) }

// Campaign runs for leader of election with value, behind the leader and
// earlier candidates in FIFO order, waiting until elected or until ctx
// ends (as Lock waits). The Leadership's Done is closed when it can no
// longer be trusted (docs/elections.md).
func (s *Session) Campaign(ctx context.Context, election, value string) (*Leadership, error) {
	g, err := s.acquire(ctx, target{kind: "election", name: election, value: value}, true)
	if err != nil {
		return nil, err
	}
	return &Leadership{Guard: g, value: value}, nil
}

// Campaign runs for leader in a session of its own (WithTTL, WithMargin),
// which resigning closes.
func (c *Client) Campaign(ctx context.Context, election, value string, opts ...LockOption) (*Leadership, error) {
	var l *Leadership
	_, err := c.owned(ctx, opts, func(s *Session) (*Guard, error) {
		var err error
		l, err = s.Campaign(ctx, election, value)
		if err != nil {
			return nil, err
		}
		return l.Guard, nil
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}

// Observe sends the election's leader on the channel every time it
// changes (a new term, or a new value; a zero LeaderInfo while nobody
// leads), starting with the current one, until ctx ends; then the channel
// is closed. It follows the election's events through outages and leader
// changes, and reads the leader again whenever it cannot follow them.
// Receive promptly: a slow receiver sees the latest leader, not every one.
func (c *Client) Observe(ctx context.Context, election string) <-chan LeaderInfo {
	out := make(chan LeaderInfo, 1)
	go func() {
		defer close(out)
		var last *LeaderInfo
		first := true
		var b backoff
		for ctx.Err() == nil {
			leader, index, err := c.leader(ctx, election)
			if err != nil {
				pause(ctx, b.next(err))
				continue
			}
			if first || changed(last, leader) {
				first = false
				var info LeaderInfo
				if leader != nil {
					info = *leader
				}
				select {
				case out <- info:
				case <-ctx.Done():
					return
				}
			}
			last = leader
			if index == 0 {
				// Without the index of the read, poll.
				pause(ctx, time.Second)
				continue
			}
			w := c.Watch(election, WatchAfterIndex(index))
			// Any event of the election may change its leader: read it again.
			if !w.Next(ctx) && w.Err() != nil && ctx.Err() == nil {
				pause(ctx, b.next(w.Err()))
			}
		}
	}()
	return out
}

func changed(before, after *LeaderInfo) bool {
	if before == nil || after == nil {
		return before != after
	}
	return before.Term != after.Term || before.Value != after.Value || before.SessionID != after.SessionID
}

func pause(ctx context.Context, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}
