package deadbolt

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Kind is the stable name of a kind of error, as the server reports it in
// the "kind" field of an error answer (docs/http-api.md, "Errors").
type Kind string

// The kinds of error a call can fail with. The client uses the server's
// names, also for the errors it finds itself (an unreachable server is
// KindUnavailable, a lease it could not renew in time KindSessionExpiring).
const (
	KindBusy             Kind = "busy"
	KindWaitTimeout      Kind = "wait_timeout"
	KindWaitCancelled    Kind = "wait_cancelled"
	KindNotHolder        Kind = "not_holder"
	KindStaleToken       Kind = "stale_token"
	KindInvalidArgument  Kind = "invalid_argument"
	KindLimitReached     Kind = "limit_reached"
	KindUnknownSession   Kind = "unknown_session"
	KindSessionExpiring  Kind = "session_expiring"
	KindNotLeader        Kind = "not_leader"
	KindUnavailable      Kind = "unavailable"
	KindOverloaded       Kind = "overloaded"
	KindNeedsUpgrade     Kind = "needs_upgrade"
	KindCompacted        Kind = "compacted"
	KindInternal         Kind = "internal"
	KindPermissionDenied Kind = "permission_denied"
	KindUnauthenticated  Kind = "unauthenticated"
)

// Error is every error this package returns about a call: the kind, the
// server's message (which names the lock, session or token involved), and
// what else the answer said. Compare with errors.Is against the Err*
// values, or take it apart with errors.As:
//
//	var failure *deadbolt.Error
//	if errors.As(err, &failure) && failure.HadNoEffect() { ... }
type Error struct {
	// Kind is the kind of failure.
	Kind Kind
	// Message says what happened, for people.
	Message string
	// Leader is the leader's address a not_leader answer named, if any.
	Leader string
	// RetryAfter is how long an overloaded server asked callers to wait.
	RetryAfter time.Duration
	// KeptAfter and CurrentIndex are a compacted answer's: the history the
	// node still keeps starts after KeptAfter; watch again after a status
	// read's index (at least CurrentIndex).
	KeptAfter, CurrentIndex uint64

	unsent  bool  // the request never left this process
	unknown bool  // a change cut off with its outcome unknown, then refused on repeat
	closed  bool  // the session was closed by its owner
	expired bool  // the client could not renew the lease in time
	cause   error // what the transport said, or the context's error
	ctxErr  error // the context's error, when the call's context ended
}

// Error gives the kind and the message.
func (e *Error) Error() string {
	if e.Message == "" {
		return "deadbolt: " + string(e.Kind)
	}
	return fmt.Sprintf("deadbolt: %s: %s", e.Kind, e.Message)
}

// Unwrap gives the underlying cause: a transport error, or the context's
// error when the call's context ended.
func (e *Error) Unwrap() error { return e.cause }

// HadNoEffect reports whether the call certainly did nothing on the
// server: a follower or an overloaded leader refused it, or it could not
// even be sent. An unavailable error without it may or may not have been
// applied.
func (e *Error) HadNoEffect() bool {
	switch e.Kind {
	case KindNotLeader, KindOverloaded:
		return true
	case KindUnavailable:
		return e.unsent
	}
	return false
}

// OutcomeUnknown reports whether the call changed state, its first attempt
// was cut off (the connection broke after sending, or a forwarding node
// lost the leader with the answer on its way), and a repeat was refused:
// the refusal (a stale token, say, once another holder fenced the key)
// does not say whether the first attempt was done, so neither can this
// error. Its Kind is KindUnavailable; read the state again to know.
func (e *Error) OutcomeUnknown() bool { return e.unknown }

// Is matches the Err* values by kind (ErrLost matches every kind that
// means the lease is gone); context.DeadlineExceeded for a wait that timed
// out; and the context's error (context.DeadlineExceeded or
// context.Canceled) when the call gave up because its context ended.
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case *sentinel:
		switch t {
		case ErrSessionClosed:
			return e.closed
		case ErrExpired:
			return e.expired
		}
		for _, kind := range t.kinds {
			if kind == e.Kind {
				return true
			}
		}
		return false
	}
	if e.ctxErr != nil && target == e.ctxErr {
		return true
	}
	return target == context.DeadlineExceeded && e.Kind == KindWaitTimeout
}

// HadNoEffect reports whether err is an *Error whose call certainly did
// nothing (see Error.HadNoEffect).
func HadNoEffect(err error) bool {
	var failure *Error
	return errors.As(err, &failure) && failure.HadNoEffect()
}

// ErrorKind is err's Kind if it is (or wraps) an *Error, else "".
func ErrorKind(err error) Kind {
	var failure *Error
	if errors.As(err, &failure) {
		return failure.Kind
	}
	return ""
}

type sentinel struct {
	text  string
	kinds []Kind
}

func (s *sentinel) Error() string { return "deadbolt: " + s.text }

func kinds(text string, kinds ...Kind) error { return &sentinel{text, kinds} }

// Values for errors.Is. Each matches the *Error values of its kind.
var (
	// ErrBusy: another session holds the lock (TryLock, or a wait-free acquire).
	ErrBusy = kinds("busy", KindBusy)
	// ErrWaitTimeout: a wait ran out of its context's deadline; it left no queue place behind.
	ErrWaitTimeout = kinds("wait timed out", KindWaitTimeout)
	// ErrWaitCancelled: the server cancelled the wait while the session lives on.
	ErrWaitCancelled = kinds("wait cancelled", KindWaitCancelled)
	// ErrNotHolder: the session does not hold that lock (released, or its lease ended).
	ErrNotHolder = kinds("not the holder", KindNotHolder)
	// ErrStaleToken: a token below the current grant or the key's fence.
	ErrStaleToken = kinds("stale token", KindStaleToken)
	// ErrInvalidArgument: a bad name, TTL, value or option.
	ErrInvalidArgument = kinds("invalid argument", KindInvalidArgument)
	// ErrLimitReached: too many sessions, locks, waiters or calls in flight.
	ErrLimitReached = kinds("limit reached", KindLimitReached)
	// ErrLost: the session's lease is gone or can no longer be trusted, so
	// every lock it held may be someone else's now (expired, ended by the
	// server, or closed).
	ErrLost = kinds("lease lost", KindSessionExpiring, KindUnknownSession)
	// ErrSessionClosed: the session was closed by its owner (Close, or
	// releasing a guard that owned it). Also matches ErrLost.
	ErrSessionClosed = kinds("session closed")
	// ErrExpired: the client could not renew the lease in time (the server
	// unreachable, or this process paused), and counted it lost a margin
	// before it could end on the server. Also matches ErrLost.
	ErrExpired = kinds("lease expired")
	// ErrNotLeader: the node was not the leader. The client follows the
	// leader by itself; this reaches the caller only when time ran out.
	ErrNotLeader = kinds("not the leader", KindNotLeader)
	// ErrUnavailable: no server could be reached or answered in time. See
	// HadNoEffect for whether the call may have been applied.
	ErrUnavailable = kinds("unavailable", KindUnavailable)
	// ErrOverloaded: the leader refused new work for now; nothing was done.
	ErrOverloaded = kinds("overloaded", KindOverloaded)
	// ErrNeedsUpgrade: the cluster version does not allow this yet.
	ErrNeedsUpgrade = kinds("needs upgrade", KindNeedsUpgrade)
	// ErrCompacted: a watch asked for history the node no longer keeps.
	ErrCompacted = kinds("compacted", KindCompacted)
	// ErrInternal: a server bug or storage failure, or an answer that is not a Deadbolt server's.
	ErrInternal = kinds("internal error", KindInternal)
	// ErrPermission: the identity lacks the permission, or the session is not its own.
	ErrPermission = kinds("permission denied", KindPermissionDenied)
	// ErrUnauthenticated: access control is on and the call had no valid credentials.
	ErrUnauthenticated = kinds("unauthenticated", KindUnauthenticated)
)

func newError(kind Kind, format string, args ...any) *Error {
	return &Error{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// ofUnknownOutcome is the error of a change whose attempt earlier was cut
// off with its outcome unknown, and whose repeat was refused. It does not
// wrap refused: errors.Is(err, ErrStaleToken) would read as "not done".
func ofUnknownOutcome(earlier, refused *Error) *Error {
	return &Error{
		Kind: KindUnavailable,
		Message: fmt.Sprintf("%s; repeated, the call was refused (%s: %s), which does not say whether "+
			"the first attempt was done: it may have been, its outcome is unknown", earlier.Message, refused.Kind, refused.Message),
		cause:   earlier.cause,
		unknown: true,
	}
}

// mayHaveBeenDone: err is an attempt's failure that does not say whether
// the server did it (the connection broke after sending, or a forwarding
// node lost its leader with the call in flight).
func mayHaveBeenDone(err error) bool {
	return ErrorKind(err) == KindUnavailable && !HadNoEffect(err)
}

// transient: worth repeating as is after a backoff.
func transient(err error) bool {
	switch ErrorKind(err) {
	case KindUnavailable, KindNotLeader, KindOverloaded:
		return true
	}
	return false
}

// endsSession: the server has no live session by that id.
func endsSession(err error) bool {
	switch ErrorKind(err) {
	case KindUnknownSession, KindSessionExpiring:
		return true
	}
	return false
}
