package deadbolt

import (
	"context"
	"strconv"
	"time"
)

const watchPoll = 30 * time.Second

// WatchEvent is one change, as the log applied it (docs/watches.md).
type WatchEvent struct {
	Index    uint64 `json:"index"`
	Position uint64 `json:"position"`
	// ID is "INDEX.POSITION": watch after it to go on from exactly here.
	ID string `json:"id"`
	// Kind is granted, released, closed, expired, abandoned, queued,
	// left_queue, delayed, proclaimed, put or deleted.
	Kind      string  `json:"kind"`
	Name      string  `json:"name"`
	SessionID uint64  `json:"session_id"`
	Identity  string  `json:"identity"`
	Token     uint64  `json:"token"`
	Mode      string  `json:"mode"`
	Permits   uint32  `json:"permits"`
	Value     *string `json:"value"`
}

// WatchOption configures a watch.
type WatchOption func(*Watcher)

// WatchPrefix watches every name that starts with the name given.
func WatchPrefix() WatchOption { return func(w *Watcher) { w.prefix = true } }

// WatchAfter starts after an event's ID, or after a log index (a status
// read's Index, as a decimal string): exactly what followed it. Without
// it, a watch starts from now.
func WatchAfter(cursor string) WatchOption { return func(w *Watcher) { w.cursor = cursor } }

// WatchAfterIndex is WatchAfter with a status read's Index.
func WatchAfterIndex(index uint64) WatchOption {
	return WatchAfter(strconv.FormatUint(index, 10))
}

// Watcher follows the events of a name (or prefix), in the order the log
// applied them, through outages and leader changes: each long poll goes on
// after the last event it gave. Use it as bufio.Scanner:
//
//	w := client.Watch("jobs/", deadbolt.WatchPrefix())
//	for w.Next(ctx) {
//		fmt.Println(w.Event().Kind, w.Event().Name)
//	}
//	err := w.Err() // ctx's error, or ErrCompacted: read the state again and watch after its Index
//
// A Watcher is for one goroutine.
type Watcher struct {
	client  *Client
	name    string
	prefix  bool
	cursor  string
	pending []WatchEvent
	event   WatchEvent
	err     error
}

// Watch returns a Watcher of name's events (see WatchPrefix, WatchAfter).
// It polls only when Next is called.
func (c *Client) Watch(name string, opts ...WatchOption) *Watcher {
	w := &Watcher{client: c, name: name}
	for _, opt := range opts {
		opt(w)
	}
	return w
}

// Next waits for the next event, and reports whether there is one: false
// once ctx ends or the watch fails (see Err).
func (w *Watcher) Next(ctx context.Context) bool {
	if w.err != nil {
		return false
	}
	for len(w.pending) == 0 {
		if err := w.poll(ctx); err != nil {
			w.err = err
			return false
		}
	}
	w.event, w.pending = w.pending[0], w.pending[1:]
	w.cursor = w.event.ID
	return true
}

func (w *Watcher) poll(ctx context.Context) error {
	query := queryOf("name", w.name, "timeout_ms", strconv.FormatUint(millis(watchPoll), 10))
	if w.prefix {
		query.Set("prefix", "true")
	}
	if w.cursor != "" {
		query.Set("after", w.cursor)
	}
	var answer struct {
		Events []WatchEvent `json:"events"`
		Cursor string       `json:"cursor"`
	}
	r := get("/v1/watch", query)
	err := w.client.retrying(ctx, retryPolicy{}, func(ctx context.Context) error {
		attempt, cancel := context.WithTimeout(ctx, watchPoll+w.client.callTimeout)
		defer cancel()
		answer.Events, answer.Cursor = nil, ""
		return w.client.send(attempt, r, &answer)
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	w.pending = answer.Events
	if len(answer.Events) == 0 && answer.Cursor != "" {
		w.cursor = answer.Cursor
	}
	return nil
}

// Event is the event Next moved to.
func (w *Watcher) Event() WatchEvent { return w.event }

// Err is why Next returned false: ctx's error, or an error matching
// ErrCompacted (the node no longer keeps the history the watch needs:
// read the state again and watch after its Index), or another failure.
func (w *Watcher) Err() error { return w.err }

// Cursor is where the watch stands: pass it to WatchAfter to go on from
// here in a new Watcher (after a restart, say).
func (w *Watcher) Cursor() string { return w.cursor }
