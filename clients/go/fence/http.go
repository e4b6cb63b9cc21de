package fence

import (
	"context"
	"errors"
	"net/http"
	"strconv"
)

// Header is the request header that carries the fencing token, as a
// decimal uint64 (the same as the Rust toolkit's FencingLayer).
const Header = "Fencing-Token"

type tokenKey struct{}

// MiddlewareOption configures Middleware.
type MiddlewareOption func(*middleware)

// AllowMissing lets requests without a Fencing-Token header through
// unchecked (for routes that only read, say). A request that carries the
// header is checked as always.
func AllowMissing() MiddlewareOption { return func(m *middleware) { m.requireToken = false } }

type middleware struct {
	gate         *Gate
	next         http.Handler
	requireToken bool
}

// Middleware wraps next so that every request must carry a current
// fencing token, admitted through gate:
//
//	token ≥ the highest admitted             next serves it (TokenFrom gives the token)
//	token < the highest admitted             409 Conflict, next not run
//	no header (unless AllowMissing)          400 Bad Request
//	not a decimal uint64, or the header twice 400 Bad Request
//
// Rejections have a one-line text/plain body; the 409 names both tokens.
// The check and the handler are not one step: for a write that must not
// run after a newer holder's, check again where the data is written
// (Gate.AdmitWith, or a fenced UPDATE with Table).
func Middleware(gate *Gate, next http.Handler, opts ...MiddlewareOption) http.Handler {
	m := &middleware{gate: gate, next: next, requireToken: true}
	for _, opt := range opts {
		opt(m)
	}
	return m
}

func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	values := r.Header.Values(Header)
	switch {
	case len(values) == 0 && !m.requireToken:
		m.next.ServeHTTP(w, r)
		return
	case len(values) == 0:
		http.Error(w, "missing Fencing-Token header", http.StatusBadRequest)
		return
	case len(values) > 1:
		http.Error(w, "more than one Fencing-Token header", http.StatusBadRequest)
		return
	}
	token, ok := parseToken(values[0])
	if !ok {
		http.Error(w, "malformed Fencing-Token header: expected a decimal integer below 2^64", http.StatusBadRequest)
		return
	}
	if err := m.gate.Admit(token); err != nil {
		var stale *StaleError
		if errors.As(err, &stale) {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	m.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tokenKey{}, token)))
}

// parseToken takes only ASCII digits: ParseUint would not take a leading
// "+", but a token is a plain decimal number, and this says so.
func parseToken(text string) (uint64, bool) {
	if text == "" {
		return 0, false
	}
	for _, c := range text {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	token, err := strconv.ParseUint(text, 10, 64)
	return token, err == nil
}

// TokenFrom is the token Middleware admitted the request with (false if
// it carried none and AllowMissing let it through).
func TokenFrom(ctx context.Context) (uint64, bool) {
	token, ok := ctx.Value(tokenKey{}).(uint64)
	return token, ok
}

// SetToken sets the Fencing-Token header of an outgoing request: the
// holder's side of Middleware.
func SetToken(r *http.Request, token uint64) {
	r.Header.Set(Header, strconv.FormatUint(token, 10))
}
