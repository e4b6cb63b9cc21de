// Package fence is the resource side of fencing, for Go services: what
// refuses a holder whose lock was lost without its knowing (a long GC
// pause, a suspended VM), so that it cannot overwrite the work of the next
// holder.
//
// A Deadbolt lock is a lease, so it only limits how long a holder thinks
// it holds the lock. Every grant comes with a fencing token, larger than
// any granted before, and what makes the work exclusive is the resource
// remembering the highest token it accepted and refusing lower ones. The
// rule is the same everywhere: a token equal to or above the mark is
// accepted and becomes the mark (one holder writes many times with its one
// token); a lower one is refused with a *StaleError, which names both.
//
//   - in this process: Gate (one mark);
//   - behind HTTP: Middleware, checking a Fencing-Token header;
//   - in a SQL database: Table, a fenced UPDATE through database/sql.
package fence

import (
	"errors"
	"fmt"
	"sync"

	deadbolt "github.com/deadbolt/deadbolt-go"
)

// StaleError refuses a token below the highest one the resource accepted.
// It matches deadbolt.ErrStaleToken with errors.Is.
type StaleError struct {
	// Presented is the refused token.
	Presented uint64
	// Accepted is the highest token the resource had accepted.
	Accepted uint64
}

// Error names both tokens.
func (e *StaleError) Error() string {
	return fmt.Sprintf("stale fencing token %d: this resource already accepted token %d", e.Presented, e.Accepted)
}

// Is matches deadbolt.ErrStaleToken.
func (e *StaleError) Is(target error) bool { return target == deadbolt.ErrStaleToken }

// Gate is one mark in this process: the highest token admitted. The zero
// Gate admits any token. Safe for concurrent use.
type Gate struct {
	mu   sync.Mutex
	mark uint64
}

// NewGate returns a gate whose mark is restored from storage (0 for new).
func NewGate(mark uint64) *Gate { return &Gate{mark: mark} }

// Admit accepts token if it is at least the mark, and makes it the mark;
// a lower one is refused with a *StaleError.
func (g *Gate) Admit(token uint64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.admit(token)
}

func (g *Gate) admit(token uint64) error {
	if token < g.mark {
		return &StaleError{Presented: token, Accepted: g.mark}
	}
	g.mark = token
	return nil
}

// AdmitWith checks the token and runs write in one step, so that an
// admitted but slow holder cannot write after a newer one: write runs with
// the gate held, only if the token is admitted, and its error is returned.
func (g *Gate) AdmitWith(token uint64, write func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.admit(token); err != nil {
		return err
	}
	return write()
}

// Mark is the highest token admitted so far: store it with the data to
// restore the gate (NewGate) after a restart.
func (g *Gate) Mark() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mark
}

// IsStale reports whether err is (or wraps) a refusal of a stale token,
// from this package or from Deadbolt's fenced store.
func IsStale(err error) bool { return errors.Is(err, deadbolt.ErrStaleToken) }
