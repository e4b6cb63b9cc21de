package deadbolt

// Calls to http:// endpoints: HTTP/1.1 on keep-alive connections of the
// client's own, each call written and its answer read by the goroutine
// that makes it.
//
// net/http's Transport hands every request to a connection's writer
// goroutine and takes the answer back from its reader goroutine: three
// goroutine hand-offs a call, and on a busy machine each is a futex wake
// and an epoll round. The profile of acquire+release pairs from 16
// goroutines put most of the client's CPU there (see the README's
// Performance, for the figures before and after). Here a call is one write
// and one read on a connection it holds alone; the answer is parsed by
// net/http's own http.ReadResponse (chunked bodies, Connection: close).
//
// https endpoints still go through net/http, which speaks HTTP/2 there
// (negotiated by ALPN): one connection carries every call and wait. Go's
// standard library has no HTTP/2 client without TLS (h2c needs
// golang.org/x/net, a module download), so http:// is HTTP/1.1 either way.

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// idleTimeout is how long a connection may sit unused in the pool before
// it is closed rather than used again.
const idleTimeout = 90 * time.Second

// checkIdleAfter is how long a connection sits idle before it is checked
// for a close by the server when taken: one used a moment ago (as under
// load) is not worth a system call.
const checkIdleAfter = time.Millisecond

// watchAfter is how long a call goes without an answer before a goroutine
// starts watching for its context's cancel (see exchange).
const watchAfter = 10 * time.Millisecond

// aLongTimeAgo is a deadline that has passed: setting it cuts every read
// and write on a connection short.
var aLongTimeAgo = time.Unix(1, 0)

// reply is a server's answer to one call.
type reply struct {
	status     int
	body       []byte
	leader     string // the deadbolt-leader header of a forwarded answer
	retryAfter string
}

// wire is the pool of keep-alive connections to http:// endpoints.
type wire struct {
	dialer  net.Dialer
	maxIdle int

	mu   sync.Mutex
	idle map[string][]*wireConn // by host:port, the most recently used last
}

type wireConn struct {
	conn      net.Conn
	reader    *bufio.Reader
	request   []byte // the buffer requests are written from, reused
	idleSince time.Time
	// watched is 1 while a goroutine may cut the connection because the
	// call's context ended. Whoever swaps it to 0 first owns the
	// connection: the watcher cuts it, or the call takes it back.
	watched int32
}

func newWire(maxIdle int) *wire {
	return &wire{
		dialer:  net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second},
		maxIdle: maxIdle,
		idle:    map[string][]*wireConn{},
	}
}

// call sends one request to host (host:port) and reads the answer, within
// ctx. replayable: the request may be sent again on a new connection when
// a kept one turns out closed by the server before answering anything (it
// was idle long enough for the server to drop it), as net/http does for
// idempotent requests.
func (w *wire) call(ctx context.Context, host, method, path, auth string, body []byte, replayable bool) (reply, error) {
	send := func(c *wireConn) error { return c.writeRequest(host, method, path, auth, body) }
	return w.exchange(ctx, host, w.dial, send, (*wireConn).readAnswer, replayable)
}

// exchange sends a request with send on a connection to key (taken from
// the pool, else dialled), and reads the answer with receive.
func (w *wire) exchange(ctx context.Context, key string, dial func(context.Context, string) (*wireConn, error),
	send func(*wireConn) error, receive func(*wireConn) (reply, bool, error), replayable bool) (reply, error) {
	// A kept connection that closed before answering: the server may
	// also have died with the request in hand, so if the request cannot
	// be sent again, that is the failure (its outcome unknown), not the
	// failed connect after it (which would say it was never sent).
	var cut error
	for {
		c, reused := w.take(key)
		if c == nil {
			var err error
			if c, err = dial(ctx, key); err != nil {
				if cut != nil {
					return reply{}, cut
				}
				return reply{}, err
			}
		}
		answer, keep, err := c.exchange(ctx, send, receive)
		if keep {
			w.put(key, c)
		} else {
			c.conn.Close()
		}
		if err != nil && reused && replayable && ctx.Err() == nil && errors.Is(err, errClosedBeforeAnswer) {
			cut = err
			continue
		}
		return answer, err
	}
}

func (w *wire) dial(ctx context.Context, host string) (*wireConn, error) {
	conn, err := w.dialer.DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, err
	}
	return &wireConn{conn: conn, reader: bufio.NewReaderSize(conn, 4096)}, nil
}

// take is an idle connection to host, the most recently used, or nil.
// One idle for checkIdleAfter is dropped if the server closed it meanwhile
// (a restart, a proxy's idle timeout, a node killed), so that a call is
// not sent on it only to find that out: it would then not know whether
// the server had the request (see call).
func (w *wire) take(host string) (*wireConn, bool) {
	for {
		w.mu.Lock()
		pool := w.idle[host]
		if len(pool) == 0 {
			w.mu.Unlock()
			return nil, false
		}
		c := pool[len(pool)-1]
		pool[len(pool)-1] = nil
		w.idle[host] = pool[:len(pool)-1]
		w.mu.Unlock()
		if time.Since(c.idleSince) < checkIdleAfter || !c.closedWhileIdle() {
			return c, true
		}
		c.conn.Close()
	}
}

// put keeps c for the next call to host, and closes the connection idle
// longest if it has been for idleTimeout (or the pool is full).
func (w *wire) put(host string, c *wireConn) {
	c.idleSince = time.Now()
	w.mu.Lock()
	pool := append(w.idle[host], c)
	var stale *wireConn
	if len(pool) > w.maxIdle || time.Since(pool[0].idleSince) > idleTimeout {
		stale = pool[0]
		pool = append(pool[:0], pool[1:]...)
	}
	w.idle[host] = pool
	w.mu.Unlock()
	if stale != nil {
		stale.conn.Close()
	}
}

// closeIdle closes every idle connection.
func (w *wire) closeIdle() {
	w.mu.Lock()
	idle := w.idle
	w.idle = map[string][]*wireConn{}
	w.mu.Unlock()
	for _, pool := range idle {
		for _, c := range pool {
			c.conn.Close()
		}
	}
}

// errClosedBeforeAnswer: the server closed the connection (or reset it)
// before a byte of the answer came.
var errClosedBeforeAnswer = errors.New("the server closed the connection before answering")

// exchange writes one request on c (send) and reads the answer (receive),
// within ctx; keep says whether c can carry another call.
//
// ctx's deadline is the connection's. A cancel before it needs a goroutine
// to watch for it, and starting one costs two goroutine hand-offs a call:
// what this file saves net/http's. Most answers come within a millisecond,
// so the watcher starts only once watchAfter has passed without one (a
// lock wait, a slow server): a cancel in the first watchAfter of a call is
// seen at its end.
func (c *wireConn) exchange(ctx context.Context, send func(*wireConn) error, receive func(*wireConn) (reply, bool, error)) (answer reply, keep bool, err error) {
	if err := ctx.Err(); err != nil {
		return reply{}, true, err
	}
	deadline, _ := ctx.Deadline()
	readDeadline := deadline
	done := ctx.Done()
	if done != nil {
		if soon := time.Now().Add(watchAfter); deadline.IsZero() || soon.Before(deadline) {
			readDeadline = soon
		} else {
			done = nil // the deadline comes first: nothing to watch for
		}
	}
	if err := c.conn.SetWriteDeadline(deadline); err != nil {
		return reply{}, false, err
	}
	if err := c.conn.SetReadDeadline(readDeadline); err != nil {
		return reply{}, false, err
	}
	if err := send(c); err != nil {
		return reply{}, false, c.failure(ctx, closedOr(err))
	}
	_, err = c.reader.Peek(1)
	if err != nil && done != nil && errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil {
		// No answer yet: watch for a cancel from now on.
		stop := c.watch(done)
		defer func() {
			close(stop)
			if !atomic.CompareAndSwapInt32(&c.watched, 1, 0) {
				keep = false // cut by the watcher
			}
		}()
		if err := c.conn.SetReadDeadline(deadline); err != nil {
			return reply{}, false, err
		}
		_, err = c.reader.Peek(1)
	} else if err == nil && !readDeadline.Equal(deadline) {
		// The answer is coming: the rest of it has until the deadline.
		if err := c.conn.SetReadDeadline(deadline); err != nil {
			return reply{}, false, err
		}
	}
	if err != nil {
		return reply{}, false, c.failure(ctx, closedOr(err))
	}
	answer, keep, err = receive(c)
	return answer, keep, c.failure(ctx, err)
}

// watch cuts c short when done is closed, until stop is.
func (c *wireConn) watch(done <-chan struct{}) (stop chan struct{}) {
	atomic.StoreInt32(&c.watched, 1)
	stop = make(chan struct{})
	go func() {
		select {
		case <-done:
			if atomic.CompareAndSwapInt32(&c.watched, 1, 0) {
				_ = c.conn.SetDeadline(aLongTimeAgo)
			}
		case <-stop:
		}
	}()
	return stop
}

// failure is err, or ctx's error if ctx ended: then the deadline or a
// cancel cut the call short, not the server.
func (c *wireConn) failure(ctx context.Context, err error) error {
	if err != nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// writeRequest sends one HTTP request.
func (c *wireConn) writeRequest(host, method, path, auth string, body []byte) error {
	out := append(c.request[:0], method...)
	out = append(out, ' ')
	out = append(out, path...)
	out = append(out, " HTTP/1.1\r\nHost: "...)
	out = append(out, host...)
	out = append(out, "\r\nUser-Agent: deadbolt-go\r\n"...)
	if auth != "" {
		out = append(out, "Authorization: "...)
		out = append(out, auth...)
		out = append(out, "\r\n"...)
	}
	if method != http.MethodGet {
		out = append(out, "Content-Type: application/json\r\nContent-Length: "...)
		out = strconv.AppendInt(out, int64(len(body)), 10)
		out = append(out, "\r\n"...)
	}
	out = append(out, "\r\n"...)
	out = append(out, body...)
	c.request = out
	_, err := c.conn.Write(out)
	return err
}

// readAnswer reads one HTTP answer; keep says whether the connection can
// carry another call.
func (c *wireConn) readAnswer() (reply, bool, error) {
	resp, err := http.ReadResponse(c.reader, nil)
	if err != nil {
		return reply{}, false, err
	}
	var raw []byte
	whole := true // read to its end, so the connection can carry another call
	if resp.ContentLength >= 0 && resp.ContentLength <= maxAnswer {
		raw = make([]byte, resp.ContentLength)
		_, err = io.ReadFull(resp.Body, raw)
	} else {
		raw, err = io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
		whole = len(raw) < maxAnswer
	}
	if err != nil {
		return reply{}, false, err
	}
	answer := reply{
		status:     resp.StatusCode,
		body:       raw,
		leader:     resp.Header.Get(leaderHeader),
		retryAfter: resp.Header.Get("Retry-After"),
	}
	return answer, whole && !resp.Close, nil
}

// closedOr is errClosedBeforeAnswer (wrapping err) if err says the server
// closed or reset the connection, else err.
func closedOr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return &closedError{err}
	}
	return err
}

type closedError struct{ err error }

func (e *closedError) Error() string        { return errClosedBeforeAnswer.Error() + ": " + e.err.Error() }
func (e *closedError) Unwrap() error        { return e.err }
func (e *closedError) Is(target error) bool { return target == errClosedBeforeAnswer }
