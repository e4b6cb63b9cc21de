package deadbolt

// Framed calls (docs/framed-calls.md): a lock's acquire and release and a
// session's keepalive as protobuf messages behind a 4-byte length on a
// plain TCP connection, instead of an HTTP/1.1 request and JSON each.
// Everything else, https:// endpoints, and every endpoint that does not
// serve them (a follower, which names the leader; an older server or a
// proxy that speaks only HTTP) stay on HTTP.
//
// Why: the server spends 1.8-2x the CPU on an acquire+release pair over
// HTTP/1.1 and JSON that it spends on framed calls, and on a machine whose
// cores the clients share with it that was most of the gap to the Rust
// client (README, Performance). Each connection carries one call at a
// time, written and read by the goroutine that makes it (see wire.go), so
// the calls need no ids of their own and no reader goroutine.
//
// The codec is written out for the few messages it needs: the module has
// no dependency, and the wire format is small and fixed (client API 1).

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

const (
	framedPreface = "\x00deadbolt-framed-calls/1\n"
	// maxFrame is the largest frame either side sends (the server's limit).
	maxFrame = 128 << 10
	// refusalMemory is how long an endpoint that refused framed calls (a
	// follower, a proxy that speaks only HTTP) gets HTTP before they are
	// tried there again.
	refusalMemory = 10 * time.Second
)

// framing is the framed side of a client's calls to http:// endpoints.
type framing struct {
	wire *wire
	auth string

	mu      sync.Mutex
	refused map[string]time.Time // host -> until when it gets HTTP
}

// errNotServed: the endpoint does not serve framed calls; the call goes
// over HTTP.
var errNotServed = errors.New("framed calls are not served here")

// call makes r a framed call to host, if r is one of the calls that go
// framed and host serves them; served is false otherwise (send it over
// HTTP then).
func (f *framing) call(ctx context.Context, host string, r request) (answer reply, served bool, err error) {
	frame := framedRequest(r)
	if frame == nil || f.refusing(host) {
		return reply{}, false, nil
	}
	answer, err = f.wire.exchange(ctx, host+" framed", f.dial,
		func(c *wireConn) error { _, err := c.conn.Write(frame); return err },
		readFramedAnswer, r.idempotent)
	if errors.Is(err, errNotServed) {
		f.refuse(host)
		return reply{}, false, nil
	}
	return answer, true, err
}

func (f *framing) refusing(host string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	until, ok := f.refused[host]
	return ok && time.Now().Before(until)
}

func (f *framing) refuse(host string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refused[host] = time.Now().Add(refusalMemory)
}

// dial opens a framed connection: the preface and a hello, answered by a
// welcome. key is "host framed".
func (f *framing) dial(ctx context.Context, key string) (*wireConn, error) {
	host := key[:len(key)-len(" framed")]
	c, err := f.wire.dial(ctx, host)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(connectTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.conn.SetDeadline(deadline)
	hello := appendString(nil, 1, f.auth)
	out := append([]byte(framedPreface), frameOf(hello)...)
	if _, err := c.conn.Write(out); err != nil {
		c.conn.Close()
		return nil, &handshakeError{err}
	}
	welcome, err := readFrame(c, 4096)
	if err != nil {
		c.conn.Close()
		var tooLong *frameTooLong
		if errors.As(err, &tooLong) || errors.Is(err, io.EOF) {
			return nil, errNotServed // an HTTP answer, or a close: not spoken here
		}
		// No welcome (a paused node, say): the call was never sent.
		return nil, &handshakeError{err}
	}
	refusal := field(welcome, 1)
	if refusal != nil {
		c.conn.Close()
		return nil, errNotServed
	}
	return c, nil
}

// framedRequest is r as a framed call (a CallRequest), or nil if r does
// not go framed.
func framedRequest(r request) []byte {
	var call []byte
	var which int
	switch body := r.body.(type) {
	case acquireBody:
		if body.Lock == "" || r.path != "/v1/lock/acquire" {
			return nil // a semaphore's or an election's: HTTP
		}
		which = 2
		call = appendUint(call, 1, body.SessionID)
		call = appendString(call, 2, body.Lock)
		if body.Wait {
			call = appendUint(call, 3, 1)
		}
		if body.TimeoutMs != nil {
			call = appendVarint(appendVarint(call, 4<<3), *body.TimeoutMs) // optional: sent even as 0
		}
		call = appendUint(call, 5, body.Attempt)
		call = appendUint(call, 6, body.LockDelayMs)
		call = appendString(call, 7, body.SessionSecret)
		call = appendString(call, 8, body.Mode)
	case releaseBody:
		if r.path != "/v1/lock/release" {
			return nil
		}
		which = 3
		call = appendUint(call, 1, body.SessionID)
		call = appendString(call, 2, body.Lock)
		call = appendUint(call, 3, body.Token)
		call = appendString(call, 4, body.SessionSecret)
	case handleBody:
		if r.path != "/v1/session/keepalive" {
			return nil
		}
		which = 4
		call = appendUint(call, 1, body.SessionID)
		call = appendString(call, 2, body.SessionSecret)
	default:
		return nil
	}
	message := appendUint(nil, 1, 1) // the id: one call at a time per connection
	message = appendBytes(message, which, call)
	return frameOf(message)
}

// readFramedAnswer reads a CallResponse and gives it as the HTTP/JSON API
// would have, for parseAnswer.
func readFramedAnswer(c *wireConn) (reply, bool, error) {
	message, err := readFrame(c, maxFrame)
	if err != nil {
		return reply{}, false, err
	}
	if failure := field(message, 5); failure != nil {
		var answer errorAnswer
		answer.Error = &struct {
			Kind         string `json:"kind"`
			Message      string `json:"message"`
			Leader       string `json:"leader"`
			KeptAfter    uint64 `json:"kept_after"`
			CurrentIndex uint64 `json:"current_index"`
		}{Kind: string(field(failure, 1)), Message: string(field(failure, 2)), Leader: string(field(failure, 3))}
		body, _ := json.Marshal(answer)
		// The connection carries another call unless this was the server's
		// last word (id 0).
		return reply{status: 409, body: body}, varint(message, 1) != 0, nil
	}
	var body []byte
	switch {
	case field(message, 2) != nil:
		body = fmt.Appendf(nil, `{"token":%d}`, varint(field(message, 2), 1))
	case field(message, 4) != nil:
		body = fmt.Appendf(nil, `{"ttl_ms":%d}`, varint(field(message, 4), 1))
	default:
		body = []byte("{}")
	}
	return reply{status: 200, body: body}, true, nil
}

// handshakeError: a framed connection failed before its welcome, so no
// call was sent on it.
type handshakeError struct{ err error }

func (e *handshakeError) Error() string {
	return "no welcome to framed calls: " + e.err.Error()
}
func (e *handshakeError) Unwrap() error { return e.err }

// ---- frames and protobuf ----------------------------------------------------------

type frameTooLong struct{ length uint32 }

func (e *frameTooLong) Error() string {
	return fmt.Sprintf("a frame of %d bytes, over the limit", e.length)
}

func frameOf(message []byte) []byte {
	out := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(message)), uint32(len(message)))
	return append(out, message...)
}

func readFrame(c *wireConn, limit uint32) ([]byte, error) {
	head, err := c.reader.Peek(4)
	if err != nil {
		return nil, closedOr(err)
	}
	length := binary.BigEndian.Uint32(head)
	if length > limit {
		return nil, &frameTooLong{length}
	}
	_, _ = c.reader.Discard(4)
	message := make([]byte, length)
	if _, err := io.ReadFull(c.reader, message); err != nil {
		return nil, err
	}
	return message, nil
}

func appendVarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }

// appendUint appends a varint field, left out at 0 (proto3's default).
func appendUint(b []byte, field int, v uint64) []byte {
	if v == 0 {
		return b
	}
	return appendVarint(appendVarint(b, uint64(field)<<3), v)
}

// appendBytes appends a length-delimited field (a string or a message).
func appendBytes(b []byte, field int, v []byte) []byte {
	b = appendVarint(b, uint64(field)<<3|2)
	return append(appendVarint(b, uint64(len(v))), v...)
}

// appendString appends a string field, left out when empty.
func appendString(b []byte, field int, s string) []byte {
	if s == "" {
		return b
	}
	b = appendVarint(b, uint64(field)<<3|2)
	return append(appendVarint(b, uint64(len(s))), s...)
}

// fields calls each with every field of message, until it returns false.
func fields(message []byte, each func(number int, wireType int, varint uint64, bytes []byte) bool) {
	for len(message) > 0 {
		tag, n := binary.Uvarint(message)
		if n <= 0 {
			return
		}
		message = message[n:]
		number, wireType := int(tag>>3), int(tag&7)
		var value uint64
		var bytes []byte
		switch wireType {
		case 0:
			if value, n = binary.Uvarint(message); n <= 0 {
				return
			}
			message = message[n:]
		case 1, 5:
			size := 8
			if wireType == 5 {
				size = 4
			}
			if len(message) < size {
				return
			}
			message = message[size:]
		case 2:
			length, n := binary.Uvarint(message)
			if n <= 0 || uint64(len(message)-n) < length {
				return
			}
			bytes = message[n : n+int(length)]
			message = message[n+int(length):]
		default:
			return
		}
		if !each(number, wireType, value, bytes) {
			return
		}
	}
}

// field is the length-delimited field number of message, or nil.
func field(message []byte, number int) []byte {
	var found []byte
	fields(message, func(n, wireType int, _ uint64, bytes []byte) bool {
		if n == number && wireType == 2 {
			found = bytes
			if found == nil {
				found = []byte{}
			}
			return false
		}
		return true
	})
	return found
}

// varint is the varint field number of message, or 0.
func varint(message []byte, number int) uint64 {
	var found uint64
	fields(message, func(n, wireType int, value uint64, _ []byte) bool {
		if n == number && wireType == 0 {
			found = value
			return false
		}
		return true
	})
	return found
}
