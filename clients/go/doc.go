// Package deadbolt is the Go client of Deadbolt, a distributed lock
// service whose every grant carries a fencing token.
//
//	client, err := deadbolt.New("http://127.0.0.1:7070")
//	...
//	guard, err := client.Lock(ctx, "invoice-981", deadbolt.WithTTL(15*time.Second))
//	if err != nil {
//		return err
//	}
//	defer guard.Release(context.Background())
//	return writeInvoice(guard.Context(), guard.Token())
//
// A lock belongs to a Session, a lease that a goroutine renews every third
// of its TTL. If renewals stop getting through (the server unreachable,
// this process paused), the guard's Done channel is closed, and its
// Context cancelled, a margin before the lease could end on the server:
// before anyone else could be granted the lock. Work given guard.Context()
// stops then by itself. Client.Lock and TryLock take a client's locks of
// one TTL and margin in one shared session, so those locks are lost
// together; WithOwnSession gives a lock a session of its own.
//
// The lease only limits how long a lock is held. What makes the work
// exclusive is the fencing token: pass Token to the resource the lock
// protects, and have it refuse tokens lower than the highest it has seen
// (package fence does that for HTTP services and SQL databases), so that
// a holder paused past its lease cannot overwrite the next one's work.
//
// Every call is repeated through outages and leader changes where that is
// safe (an acquire by the same session is idempotent on the server; a
// release whose repeat answers "not holder" after an attempt with no answer
// went through; keepalives repeat freely), moving between the endpoints
// and following the leader a follower or a forwarding node names, until
// the call's context ends. A change repeated after an attempt whose outcome
// is unknown, then refused, fails as unavailable with its outcome unknown
// (Error.OutcomeUnknown), not with the refusal. Blocking waits honour the
// context: its deadline is sent to the server, which answers wait_timeout
// then, and a cancel gives the queue place (or a grant answered as the
// caller left) back at once.
//
// Errors are *Error values with a Kind; compare them with errors.Is
// against ErrBusy, ErrLost, ErrNotHolder, ErrPermission, ErrUnavailable
// and the others, and see HadNoEffect for whether a failed call may have
// been applied.
package deadbolt
