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
	backoffCap     = time.Second
	cleanUpDelay   = time.Second
	maxAnswer      = 64 << 20
)

// Client is a connection to a Deadbolt cluster, safe for concurrent use:
// share one per process. It speaks the HTTP/JSON API (docs/http-api.md)
// with keep-alive connections, follows the leader a follower names, and
// repeats every call that is safe to repeat through outages and leader
// changes, until the call's context ends.
type Client struct {
	endpoints   *endpoints
	http        *http.Client
	auth        string
	callTimeout time.Duration
}

type config struct {
	caFile, certFile, keyFile string
	tls                       *tls.Config
	token                     string
	maxIdle                   int
	callTimeout               time.Duration
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
	cfg := config{maxIdle: 256, callTimeout: DefaultCallTimeout}
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
		IdleConnTimeout:     90 * time.Second,
	}
	client := &Client{
		endpoints:   eps,
		http:        &http.Client{Transport: transport},
		callTimeout: cfg.callTimeout,
	}
	if cfg.token != "" {
		client.auth = "Bearer " + cfg.token
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

// Close closes the client's idle connections. Sessions still open keep
// renewing (on new connections); close them first.
func (c *Client) Close() error {
	c.http.CloseIdleConnections()
	return nil
}

// Endpoints are the servers the client knows, the one it talks to first.
func (c *Client) Endpoints() []string {
	c.endpoints.mu.Lock()
	defer c.endpoints.mu.Unlock()
	out := append([]string(nil), c.endpoints.urls[c.endpoints.current:]...)
	return append(out, c.endpoints.urls[:c.endpoints.current]...)
}

// ---- endpoints ----------------------------------------------------------

// endpoints are the servers a client knows, and the one it talks to now.
// A follower names the leader in its not_leader answer; the client goes
// there (and remembers it) instead of guessing.
type endpoints struct {
	mu      sync.Mutex
	urls    []string
	current int
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
	return &endpoints{urls: urls}, nil
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
	return e.urls[e.current]
}

// failed moves on after err from base: to the leader it named, or to the
// next endpoint.
func (e *endpoints) failed(base string, err *Error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.urls[e.current] != base {
		return // another call moved on already
	}
	if err.Kind == KindNotLeader && err.Leader != "" {
		scheme := base[:strings.Index(base, "://")]
		leader := scheme + "://" + err.Leader
		for i, known := range e.urls {
			if known == leader {
				e.current = i
				return
			}
		}
		e.urls = append(e.urls, leader)
		e.current = len(e.urls) - 1
		return
	}
	if err.Kind == KindUnavailable || err.Kind == KindNotLeader {
		e.current = (e.current + 1) % len(e.urls)
	}
}

// ---- one request ----------------------------------------------------------

// request is one call of the HTTP API.
type request struct {
	method string
	path   string // with the query
	body   any
	// Whether repeating it is safe: reads, and writes that do the same
	// thing twice. Go's transport may then also resend it by itself on a
	// kept connection the server had closed.
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
// leader a follower names) before the error is returned.
func (c *Client) send(ctx context.Context, r request, out any) error {
	base := c.endpoints.url()
	var body io.Reader
	if r.body != nil {
		data, err := json.Marshal(r.body)
		if err != nil {
			return newError(KindInvalidArgument, "cannot encode the request: %v", err)
		}
		body = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, base+r.path, body)
	if err != nil {
		return newError(KindInvalidArgument, "bad request: %v", err)
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
		failure := unreachable(base, err)
		c.endpoints.failed(base, failure)
		return failure
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		failure := unreachable(base, err)
		c.endpoints.failed(base, failure)
		return failure
	}
	if failure := parseAnswer(resp.StatusCode, raw, resp.Header.Get("Retry-After"), out); failure != nil {
		c.endpoints.failed(base, failure)
		return failure
	}
	return nil
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
	if errors.As(err, &op) && op.Op == "dial" {
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
			return err
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

// call sends r, repeating it through outages and leader changes (if it is
// safe to repeat) until ctx's deadline, or the call timeout without one.
func (c *Client) call(ctx context.Context, r request, out any) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	if !r.idempotent {
		return c.send(ctx, r, out)
	}
	return c.retrying(ctx, retryPolicy{}, func(ctx context.Context) error { return c.send(ctx, r, out) })
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
