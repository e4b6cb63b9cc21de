package deadbolt

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultEndpoint is the server New talks to when given no endpoint.
const DefaultEndpoint = "http://127.0.0.1:7070"

// DefaultCallTimeout bounds, with no deadline on the context, how long a
// call that does not wait for a lock keeps being repeated through an
// outage or a leader change (see WithCallTimeout).
const DefaultCallTimeout = 10 * time.Second

const (
	connectTimeout = 2 * time.Second
	backoffBase    = 50 * time.Millisecond
	// backoffCap spaces the repeats of a call an overloaded leader
	// refused: recovery is seen within a second, and the refused callers
	// stay spread out.
	backoffCap = time.Second
	// failoverCap spaces the repeats through a failover (unavailable,
	// not_leader): an election takes 0.2-0.6 s at the default timeouts,
	// and a pause of up to a second after it made callers wait for
	// nothing (issue 59; the Rust, Python and TypeScript clients' cap too).
	// A node that cannot serve answers at once and cheaply, and the jitter
	// still spreads a dead leader's clients over a quarter of a second.
	failoverCap  = 250 * time.Millisecond
	cleanUpDelay = time.Second
	maxAnswer    = 64 << 20
	// leaderHeader names the leader in an answer a node forwarded to it.
	leaderHeader = "Deadbolt-Leader"
)

// Client is a connection to a Deadbolt cluster, safe for concurrent use:
// share one per process. It speaks the HTTP/JSON API (docs/http-api.md)
// with keep-alive connections, follows the leader a follower names, and
// repeats every call that is safe to repeat through outages and leader
// changes, until the call's context ends.
type Client struct {
	endpoints   *endpoints
	wire        *wire        // http:// endpoints
	framing     *framing     // http:// endpoints' framed calls, unless turned off
	http        *http.Client // https:// endpoints
	auth        string
	callTimeout time.Duration
	shared      *sharedSessions // Lock's and TryLock's (shared.go)
}

type config struct {
	caFile, certFile, keyFile string
	tls                       *tls.Config
	token                     string
	maxIdle                   int
	callTimeout               time.Duration
	framed                    bool
	err                       error
}

// Option configures a Client (see New).
type Option func(*config)

// WithCAFile verifies https endpoints against the PEM certificates in path
// (the system's roots without it), e.g. the certs/ca.pem of
// `deadbolt certs ca`.
func WithCAFile(path string) Option { return func(c *config) { c.caFile = path } }

// WithClientCertificate presents the PEM certificate and key in certFile
// and keyFile to https endpoints (mutual TLS): the certificate's name is
// the client's identity for access control.
func WithClientCertificate(certFile, keyFile string) Option {
	return func(c *config) { c.certFile, c.keyFile = certFile, keyFile }
}

// WithTLSConfig sets the TLS settings of https endpoints outright; the
// CA and certificate options add to it.
func WithTLSConfig(cfg *tls.Config) Option {
	return func(c *config) { c.tls = cfg.Clone() }
}

// WithAccessToken sends token (from `deadbolt acl token create`) as the
// bearer token of every call. An empty token sends none.
func WithAccessToken(token string) Option { return func(c *config) { c.token = token } }

// WithMaxIdleConnections keeps at most n idle keep-alive connections per
// endpoint (default 256). Each blocking wait holds a connection of its own
// over HTTP/1.1.
func WithMaxIdleConnections(n int) Option { return func(c *config) { c.maxIdle = n } }

// WithFramedCalls(false) sends every call to http:// endpoints over
// HTTP/1.1. By default (true) a lock's acquire and release and a
// session's keepalive go there as framed calls (docs/framed-calls.md): a
// 4-byte length and a protobuf message on a TCP connection, which costs
// the server about half the CPU of an HTTP request with JSON. An endpoint
// that does not serve them (a follower, an older server, a proxy that
// speaks only HTTP) gets the calls over HTTP. https:// endpoints always go
// through net/http: this client does not speak framed calls inside TLS.
func WithFramedCalls(on bool) Option { return func(c *config) { c.framed = on } }

// WithCallTimeout sets how long, with no deadline on the context, a call
// that does not wait for a lock keeps being repeated through outages
// (default DefaultCallTimeout). A context deadline always wins.
func WithCallTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.err = newError(KindInvalidArgument, "the call timeout must be positive, not %v", d)
		}
		c.callTimeout = d
	}
}

// FromEnvironment reads what the CLI reads: DEADBOLT_CA, DEADBOLT_CERT and
// DEADBOLT_KEY, and DEADBOLT_ACCESS_TOKEN. Pass os.Getenv("DEADBOLT_ENDPOINT")
// (or DefaultEndpoint when it is empty) as New's endpoints.
func FromEnvironment() Option {
	return func(c *config) {
		if ca := os.Getenv("DEADBOLT_CA"); ca != "" {
			c.caFile = ca
		}
		if cert := os.Getenv("DEADBOLT_CERT"); cert != "" {
			c.certFile, c.keyFile = cert, os.Getenv("DEADBOLT_KEY")
		}
		if token := os.Getenv("DEADBOLT_ACCESS_TOKEN"); token != "" {
			c.token = token
		}
	}
}

// New returns a client of the cluster at endpoints: one URL, several
// comma-separated, or a slice of them ("http://10.0.0.1:7070", or a bare
// "host:port", which is http, or https with a CA or client certificate
// given). One node is enough, since followers forward calls to the leader;
// give every node's address to get in while one is down. An empty string
// means DefaultEndpoint. New makes no connection: the first call does.
func New[E string | []string](endpoints E, opts ...Option) (*Client, error) {
	var list []string
	switch e := any(endpoints).(type) {
	case string:
		list = []string{e}
		if strings.TrimSpace(e) == "" {
			list = []string{DefaultEndpoint}
		}
	case []string:
		list = e
	}
	cfg := config{maxIdle: 256, callTimeout: DefaultCallTimeout, framed: true}
	for _, opt := range opts {
		opt(&cfg)
	}
	if cfg.err != nil {
		return nil, cfg.err
	}
	tlsConfig, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	eps, err := parseEndpoints(list, cfg.caFile != "" || cfg.certFile != "")
	if err != nil {
		return nil, err
	}
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: 2 * connectTimeout,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: cfg.maxIdle,
		IdleConnTimeout:     idleTimeout,
	}
	client := &Client{
		endpoints:   eps,
		wire:        newWire(cfg.maxIdle),
		http:        &http.Client{Transport: transport},
		callTimeout: cfg.callTimeout,
		shared:      newSharedSessions(),
	}
	if cfg.token != "" {
		client.auth = "Bearer " + cfg.token
	}
	if cfg.framed {
		client.framing = &framing{wire: client.wire, auth: client.auth, refused: map[string]time.Time{}}
	}
	return client, nil
}

func (c *config) tlsConfig() (*tls.Config, error) {
	out := c.tls
	if out == nil {
		out = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if c.caFile != "" {
		pem, err := os.ReadFile(c.caFile)
		if err != nil {
			return nil, newError(KindInvalidArgument, "cannot read the CA file: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, newError(KindInvalidArgument, "no PEM certificate in the CA file %s", c.caFile)
		}
		out.RootCAs = pool
	}
	if c.certFile != "" {
		cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
		if err != nil {
			return nil, newError(KindInvalidArgument, "cannot load the client certificate %s and key %s: %v", c.certFile, c.keyFile, err)
		}
		out.Certificates = append(out.Certificates, cert)
	}
	return out, nil
}

// Close closes the sessions Lock and TryLock share, which releases every
// lock still held in them, and the client's idle connections. Sessions of
// NewSession still open keep renewing (on new connections); close them
// first.
func (c *Client) Close() error {
	c.closeShared()
	c.wire.closeIdle()
	c.http.CloseIdleConnections()
	return nil
}

// Endpoints are the servers the client knows, the one it talks to first.
func (c *Client) Endpoints() []string {
	e := c.endpoints
	e.mu.Lock()
	defer e.mu.Unlock()
	out := []string{e.current}
	for step := range e.given {
		if given := e.given[(e.index+step)%len(e.given)]; given != e.current {
			out = append(out, given)
		}
	}
	return out
}

// ---- endpoints ----------------------------------------------------------

// endpoints are the servers a client was given, and the one it talks to
// now: one of them, or a leader a node named outside them. A follower
// names the leader in its not_leader answer, and a node that forwarded a
// call names it in a deadbolt-leader header; the client goes there instead
// of guessing (as the Rust client does: crates/client/src/client.rs). It
// keeps one such address at a time, so nothing accumulates.
type endpoints struct {
	given []string

	mu sync.Mutex
	// index is the search's place among given: where the next endpoint
	// is looked for once the current one fails without naming a leader.
	index   int
	current string
	// hinted: current is a leader a forwarded answer named, not a
	// failure. followHints goes false once such a leader could not be
	// connected to: the client may sit behind a load balancer, with the
	// leaders' addresses out of its reach, and the forwarding nodes
	// serve it anyway.
	hinted      bool
	followHints bool
}

func parseEndpoints(items []string, tls bool) (*endpoints, error) {
	var urls []string
	for _, item := range items {
		for _, part := range strings.Split(item, ",") {
			part = strings.TrimRight(strings.TrimSpace(part), "/")
			if part == "" {
				continue
			}
			normal, err := normalize(part, tls)
			if err != nil {
				return nil, err
			}
			urls = append(urls, normal)
		}
	}
	if len(urls) == 0 {
		return nil, newError(KindInvalidArgument, "no Deadbolt server endpoint given")
	}
	return &endpoints{given: urls, current: urls[0], followHints: true}, nil
}

// normalize: "host:port" means http://host:port (https with TLS), and a
// bare host port 7070, as for the other clients and the CLI.
func normalize(endpoint string, tls bool) (string, error) {
	if !strings.Contains(endpoint, "://") {
		scheme := "http"
		if tls {
			scheme = "https"
		}
		endpoint = scheme + "://" + endpoint
	}
	parsed, err := url.Parse(endpoint)
	if err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
		return "", newError(KindInvalidArgument, "endpoint %q: use http://host:port or https://host:port", endpoint)
	}
	host := parsed.Host
	if parsed.Port() == "" {
		host = net.JoinHostPort(strings.Trim(parsed.Hostname(), "[]"), "7070")
	}
	return parsed.Scheme + "://" + host, nil
}

func (e *endpoints) url() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.current
}

// failed moves on after err from base: to the leader it named, or to the
// next endpoint given. Nothing changes if another call moved on from base
// already.
func (e *endpoints) failed(base string, err *Error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.current != base {
		return
	}
	if e.hinted && err.Kind == KindUnavailable && err.unsent {
		e.followHints = false
	}
	if err.Kind == KindNotLeader && err.Leader != "" {
		e.switchTo(base, err.Leader, false)
		return
	}
	if err.Kind == KindUnavailable || err.Kind == KindNotLeader {
		for step := 1; step <= len(e.given); step++ {
			next := (e.index + step) % len(e.given)
			if e.given[next] != base {
				e.index, e.current, e.hinted = next, e.given[next], false
				return
			}
		}
	}
}

// followHint takes later calls to the leader a node that forwarded a call
// from base named (a hop shorter), unless hints are no longer followed.
func (e *endpoints) followHint(base, leader string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.followHints && e.current == base {
		e.switchTo(base, leader, true)
	}
}

// switchTo points calls at leader (host:port), named by base and reached
// the way base is (its scheme, and so its TLS settings: a node's
// certificate must still verify, so a hint cannot take the client and its
// access token to a server the CA does not vouch for). The search's place
// stays where it was: going back to the endpoint that named a leader, once
// that leader knows none, would ping-pong between the two while the
// others elect one. Called with mu held.
func (e *endpoints) switchTo(base, leader string, hinted bool) {
	scheme := base[:strings.Index(base, "://")]
	address, err := normalize(scheme+"://"+leader, false)
	if err != nil || address == e.current {
		return
	}
	e.current, e.hinted = address, hinted
}

// ---- one request ----------------------------------------------------------

// request is one call of the HTTP API.
type request struct {
	method string
	path   string // with the query
	body   any
	// Whether repeating it is safe: reads, and writes that do the same
	// thing twice. It is then also sent again, at once, when a kept
	// connection turns out closed by the server (wire.go; net/http does
	// the same).
	idempotent bool
}

func get(path string, query url.Values) request {
	return request{method: http.MethodGet, path: path + "?" + query.Encode(), idempotent: true}
}

func post(path string, body any) request {
	return request{method: http.MethodPost, path: path, body: body, idempotent: true}
}

// send makes one attempt at r on the current endpoint and decodes the
// answer into out (unless nil). On failure the endpoint moves on (to the
// leader a follower names) before the error is returned; a forwarded
// answer's leader hint moves it on too.
func (c *Client) send(ctx context.Context, r request, out any) error {
	base := c.endpoints.url()
	answer, err := c.exchange(ctx, base, r)
	var refused *Error
	if errors.As(err, &refused) {
		return refused // by this process, before sending
	}
	if err != nil {
		failure := unreachable(base, err)
		c.endpoints.failed(base, failure)
		return failure
	}
	if failure := parseAnswer(answer.status, answer.body, answer.retryAfter, out); failure != nil {
		c.endpoints.failed(base, failure)
		return failure
	}
	if answer.leader != "" {
		c.endpoints.followHint(base, answer.leader)
	}
	return nil
}

// exchange sends r to base and reads the answer: for http://, as a framed
// call where the client makes them and base serves them (framed.go), else
// over the client's own HTTP/1.1 connections (wire.go); for https://,
// through net/http, which speaks HTTP/2 there.
func (c *Client) exchange(ctx context.Context, base string, r request) (reply, error) {
	if strings.HasPrefix(base, "http://") && c.framing != nil {
		if answer, served, err := c.framing.call(ctx, base[len("http://"):], r); served {
			return answer, err
		}
	}
	var body []byte
	if r.body != nil {
		var err error
		if body, err = json.Marshal(r.body); err != nil {
			return reply{}, newError(KindInvalidArgument, "cannot encode the request: %v", err)
		}
	}
	if strings.HasPrefix(base, "http://") {
		return c.wire.call(ctx, base[len("http://"):], r.method, r.path, c.auth, body, r.idempotent)
	}
	var reader io.Reader
	if body != nil {
		reader = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, base+r.path, reader)
	if err != nil {
		return reply{}, newError(KindInvalidArgument, "bad request: %v", err)
	}
	if body != nil {
		req.Header["Content-Type"] = []string{"application/json"}
	}
	if c.auth != "" {
		req.Header["Authorization"] = []string{c.auth}
	}
	if r.idempotent && r.method != http.MethodGet {
		// Marks the request replayable for net/http, without sending it.
		req.Header["X-Idempotency-Key"] = nil
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return reply{}, err
	}
	return reply{
		status:     resp.StatusCode,
		body:       raw,
		leader:     resp.Header.Get(leaderHeader),
		retryAfter: resp.Header.Get("Retry-After"),
	}, nil
}

type errorAnswer struct {
	Error *struct {
		Kind         string `json:"kind"`
		Message      string `json:"message"`
		Leader       string `json:"leader"`
		KeptAfter    uint64 `json:"kept_after"`
		CurrentIndex uint64 `json:"current_index"`
	} `json:"error"`
}

// parseAnswer decodes a successful answer into out, or returns the error
// an error answer names.
func parseAnswer(status int, raw []byte, retryAfter string, out any) *Error {
	if status < 300 {
		if out == nil {
			return nil
		}
		if len(raw) == 0 {
			raw = []byte("{}")
		}
		if err := json.Unmarshal(raw, out); err != nil {
			return newError(KindInternal, "unexpected answer (HTTP %d), not from a Deadbolt server? %v: %.200q", status, err, raw)
		}
		return nil
	}
	var answer errorAnswer
	if err := json.Unmarshal(raw, &answer); err != nil || answer.Error == nil {
		kind := KindInternal
		if status == 502 || status == 503 || status == 504 {
			kind = KindUnavailable
		}
		return newError(kind, "unexpected reply (HTTP %d), not from a Deadbolt server? %.200q", status, raw)
	}
	e := answer.Error
	failure := &Error{
		Kind:         Kind(e.Kind),
		Message:      e.Message,
		Leader:       e.Leader,
		KeptAfter:    e.KeptAfter,
		CurrentIndex: e.CurrentIndex,
	}
	if failure.Kind == "" {
		failure.Kind = KindInternal
	}
	if seconds, err := strconv.ParseFloat(retryAfter, 64); err == nil && seconds > 0 {
		failure.RetryAfter = time.Duration(seconds * float64(time.Second))
	}
	return failure
}

// unreachable is the error of a request that got no answer from base.
func unreachable(base string, err error) *Error {
	reason := err
	var urlError *url.Error
	if errors.As(err, &urlError) {
		reason = urlError.Err
	}
	failure := newError(KindUnavailable, "could not reach the Deadbolt server at %s: %v", base, reason)
	failure.cause = err
	failure.unsent = unsent(err)
	return failure
}

// unsent: the request certainly never reached the server (the connection
// or its TLS handshake failed).
func unsent(err error) bool {
	var op *net.OpError
	var handshake *handshakeError
	if (errors.As(err, &op) && op.Op == "dial") || errors.As(err, &handshake) {
		return true
	}
	var (
		unknownAuthority x509.UnknownAuthorityError
		invalid          x509.CertificateInvalidError
		hostname         x509.HostnameError
		record           tls.RecordHeaderError
	)
	return errors.As(err, &unknownAuthority) || errors.As(err, &invalid) ||
		errors.As(err, &hostname) || errors.As(err, &record)
}

// ---- retries ----------------------------------------------------------

// backoff is exponential backoff with full jitter: every client of a
// failed-over server retries at about the same moment, and a delay drawn
// uniformly from zero to the exponential ceiling spreads them out.
type backoff struct{ attempt int }

func (b *backoff) next(err error) time.Duration {
	ceiling := backoffCap
	if kind := ErrorKind(err); kind == KindUnavailable || kind == KindNotLeader {
		ceiling = failoverCap
	}
	if b.attempt < 16 {
		if c := backoffBase << b.attempt; c < ceiling {
			ceiling = c
		}
	}
	b.attempt++
	delay := time.Duration(rand.Int63n(int64(ceiling) + 1))
	// An overloaded leader names how long to stay away: a draw up to it,
	// jittered too, so refused callers come back spread out.
	var failure *Error
	if errors.As(err, &failure) && failure.RetryAfter > 0 {
		if d := time.Duration(rand.Int63n(int64(failure.RetryAfter) + 1)); d > delay {
			delay = d
		}
	}
	return delay
}

// retryPolicy is how one call is repeated: which errors are worth another
// attempt (transient by default), until when (the context's deadline, or
// giveUp if earlier), and whether the lease the call depends on is gone
// (then anything it could achieve is gone too, and that is the answer).
type retryPolicy struct {
	giveUp    time.Time
	lost      func() error
	retryable func(error) bool
	// idempotentChange: the call changes state and a repeat does nothing
	// more (opening a session, a fenced put or delete, a proclaim). But a
	// refusal of the repeat does not say the first attempt did nothing: a
	// fenced put that went through, its answer lost, then refused as
	// stale once a newer holder fenced the key. After an attempt of
	// unknown outcome, a refusal is reported as that: unavailable, the
	// outcome unknown (found by the Rust client's simulation, seed 190: a
	// counter one above its acknowledged increments).
	idempotentChange bool
}

// retrying calls attempt until it succeeds, fails in a way not worth
// repeating, or time runs out (the last error is then returned, its cause
// the context's error if the context ended).
func (c *Client) retrying(ctx context.Context, policy retryPolicy, attempt func(context.Context) error) error {
	var b backoff
	until, ctxDeadline := policy.giveUp, false
	if deadline, ok := ctx.Deadline(); ok && (until.IsZero() || !until.Before(deadline)) {
		until, ctxDeadline = deadline, true
	}
	retryable := policy.retryable
	if retryable == nil {
		retryable = transient
	}
	// An earlier attempt that may have gone through: what a later one is
	// refused with is then not the whole story.
	var maybeDone *Error
	for {
		if policy.lost != nil {
			if err := policy.lost(); err != nil {
				return err
			}
		}
		err := attempt(ctx)
		if err == nil {
			return nil
		}
		if !retryable(err) {
			var refused *Error
			if maybeDone != nil && errors.As(err, &refused) {
				return ofUnknownOutcome(maybeDone, refused)
			}
			return err
		}
		if policy.idempotentChange && maybeDone == nil && mayHaveBeenDone(err) {
			errors.As(err, &maybeDone)
		}
		if ctx.Err() != nil {
			return withCause(err, ctx.Err())
		}
		delay := b.next(err)
		if !until.IsZero() && time.Now().Add(delay).After(until) {
			if ctxDeadline {
				// The context's deadline would pass before the next attempt.
				return withCause(err, context.DeadlineExceeded)
			}
			return err
		}
		timer := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			timer.Stop()
			return withCause(err, ctx.Err())
		case <-timer.C:
		}
	}
}

func withCause(err error, cause error) error {
	var failure *Error
	if errors.As(err, &failure) && failure.ctxErr == nil {
		failure.ctxErr = cause
	}
	return err
}

// bounded gives ctx the client's call timeout when it has no deadline.
func (c *Client) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.callTimeout)
}

// call sends r, repeating it through outages and leader changes until
// ctx's deadline, or the call timeout without one: after any failure if it
// is idempotent, else only after one that certainly had no effect.
func (c *Client) call(ctx context.Context, r request, out any) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	policy := retryPolicy{idempotentChange: r.method != http.MethodGet}
	if !r.idempotent {
		policy = retryPolicy{retryable: HadNoEffect}
	}
	return c.retrying(ctx, policy, func(ctx context.Context) error { return c.send(ctx, r, out) })
}

// checkName refuses what the server would refuse anyway, before a session
// is opened for it.
func checkName(what, name string) error {
	if name == "" || len(name) > 512 {
		return newError(KindInvalidArgument, "a %s name is 1 to 512 bytes, not %d", what, len(name))
	}
	return nil
}

func millis(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Millisecond/2) / time.Millisecond)
}

func fmtDuration(d time.Duration) string { return fmt.Sprint(d.Round(time.Millisecond)) }
