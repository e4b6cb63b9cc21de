package deadbolt

import (
	"context"
	"strconv"
)

// Holder is one holder of a read/write lock.
type Holder struct {
	SessionID uint64 `json:"session_id"`
	Mode      string `json:"mode"`
	Token     uint64 `json:"token"`
}

// LockStatus is who holds a lock, with which token, and who waits, in
// queue order.
type LockStatus struct {
	Name string `json:"lock"`
	// Holder is the holding session (for a read/write lock, the first
	// holder; see Holders).
	Holder uint64 `json:"holder_session_id"`
	Token  uint64 `json:"token"`
	// Waiters are the waiting sessions, in queue order.
	Waiters []uint64 `json:"waiter_session_ids"`
	// Mode is a read/write lock's: "shared" or "exclusive" ("" for a lock).
	Mode string `json:"mode"`
	// Holders are a read/write lock's holders.
	Holders []Holder `json:"holders"`
	// LockDelay: the holder's session expired and nobody holds it until
	// the lock delay ends (Holder and Token are the lost grant's).
	LockDelay bool `json:"lock_delay"`
	// Index is the log index of the state read: a watch after it follows
	// on from it.
	Index uint64 `json:"-"`
}

// Status reads who holds the lock name (and who waits): nil when nobody
// holds it. A linearizable read through the leader.
func (c *Client) Status(ctx context.Context, name string) (*LockStatus, error) {
	var answer struct {
		State *LockStatus `json:"state"`
		Index uint64      `json:"index"`
	}
	if err := c.call(ctx, get("/v1/lock/status", queryOf("lock", name)), &answer); err != nil {
		return nil, err
	}
	if answer.State != nil {
		answer.State.Index = answer.Index
	}
	return answer.State, nil
}

// Locks lists every held lock, in name order (read page by page).
func (c *Client) Locks(ctx context.Context) ([]LockStatus, error) {
	var held []LockStatus
	after := ""
	for {
		var page struct {
			Locks []LockStatus `json:"locks"`
			More  bool         `json:"more"`
			Index uint64       `json:"index"`
		}
		query := queryOf("limit", "200")
		if after != "" {
			query.Set("after", after)
		}
		if err := c.call(ctx, get("/v1/locks", query), &page); err != nil {
			return nil, err
		}
		for i := range page.Locks {
			page.Locks[i].Index = page.Index
		}
		held = append(held, page.Locks...)
		if !page.More || len(page.Locks) == 0 {
			return held, nil
		}
		after = page.Locks[len(page.Locks)-1].Name
	}
}

// AuditEntry is one change of a lock. What is granted, released, closed,
// expired, abandoned or delayed; AtMs the leader's wall clock, for people
// (order by Seq).
type AuditEntry struct {
	Seq       uint64 `json:"seq"`
	AtMs      uint64 `json:"at_ms"`
	SessionID uint64 `json:"session_id"`
	Token     uint64 `json:"token"`
	What      string `json:"what"`
	Identity  string `json:"identity"`
}

// History is the recent grants and releases of the lock name, oldest first.
func (c *Client) History(ctx context.Context, name string) ([]AuditEntry, error) {
	var answer struct {
		Entries []AuditEntry `json:"entries"`
	}
	err := c.call(ctx, get("/v1/lock/history", queryOf("lock", name)), &answer)
	return answer.Entries, err
}

// Check reports whether token is the current grant of the lock name: for
// a resource that cannot keep its own highest-token record. A
// linearizable read; the answer can change right after it.
func (c *Client) Check(ctx context.Context, name string, token uint64) (bool, error) {
	var answer struct {
		Current bool `json:"current"`
	}
	err := c.call(ctx, get("/v1/lock/check", queryOf("lock", name, "token", strconv.FormatUint(token, 10))), &answer)
	return answer.Current, err
}

// SemaphoreHolder is a session's permits of a semaphore.
type SemaphoreHolder struct {
	SessionID uint64   `json:"session_id"`
	Permits   []Permit `json:"permits"`
}

// SemaphoreWaiter is a session waiting for Count permits.
type SemaphoreWaiter struct {
	SessionID uint64 `json:"session_id"`
	Count     uint32 `json:"count"`
}

// SemaphoreStatus is a semaphore's capacity, its holders' permits, and its
// waiters in queue order.
type SemaphoreStatus struct {
	Name     string            `json:"semaphore"`
	Capacity uint32            `json:"capacity"`
	Holders  []SemaphoreHolder `json:"holders"`
	Waiters  []SemaphoreWaiter `json:"waiters"`
	// Defined: an admin defined it (it stays while unused).
	Defined bool   `json:"defined"`
	Index   uint64 `json:"-"`
}

// SemaphoreStatus reads a semaphore: nil if it neither exists nor is
// defined.
func (c *Client) SemaphoreStatus(ctx context.Context, name string) (*SemaphoreStatus, error) {
	var answer struct {
		State *SemaphoreStatus `json:"state"`
		Index uint64           `json:"index"`
	}
	if err := c.call(ctx, get("/v1/semaphore/status", queryOf("semaphore", name)), &answer); err != nil {
		return nil, err
	}
	if answer.State != nil {
		answer.State.Index = answer.Index
	}
	return answer.State, nil
}

// DefineSemaphore creates the semaphore name with capacity permits, kept
// while nobody holds it, or changes the capacity of the one that exists
// (docs/semaphores.md); it needs the admin permission. Acquirers may then
// ask for capacity 0 to take what it has. It returns the semaphore's state.
func (c *Client) DefineSemaphore(ctx context.Context, name string, capacity uint32) (*SemaphoreStatus, error) {
	body := struct {
		Semaphore string `json:"semaphore"`
		Capacity  uint32 `json:"capacity"`
	}{name, capacity}
	return c.semaphoreDefinition(ctx, "/v1/semaphore/define", body)
}

// DeleteSemaphore drops the definition of the semaphore name: it goes once
// nobody holds or waits on it. It needs the admin permission, and fails
// with ErrInvalidArgument for a semaphore nobody defined. It returns what
// is left of the semaphore (nil if nothing).
func (c *Client) DeleteSemaphore(ctx context.Context, name string) (*SemaphoreStatus, error) {
	body := struct {
		Semaphore string `json:"semaphore"`
	}{name}
	return c.semaphoreDefinition(ctx, "/v1/semaphore/delete", body)
}

// semaphoreDefinition sends a definition's change, repeated only if it
// certainly had no effect (as the Rust client does): a delete repeated
// after one that went through would be refused, not-defined.
func (c *Client) semaphoreDefinition(ctx context.Context, path string, body any) (*SemaphoreStatus, error) {
	var answer struct {
		State *SemaphoreStatus `json:"state"`
	}
	r := post(path, body)
	r.idempotent = false
	if err := c.call(ctx, r, &answer); err != nil {
		return nil, err
	}
	return answer.State, nil
}

// ---- the fenced store ----------------------------------------------------------

// Stored is a key of the fenced store: its value (Found false if it has
// none) and its fence, the highest token it has accepted.
type Stored struct {
	Found bool   `json:"found"`
	Value string `json:"value"`
	Fence uint64 `json:"fence"`
}

type storeBody struct {
	Key   string `json:"key"`
	Value string `json:"value,omitempty"`
	Token uint64 `json:"token,omitempty"`
	Lock  string `json:"lock,omitempty"`
}

// Put writes value to the fenced store's key, unless token is below the
// key's fence (ErrStaleToken); with lock not empty, token must also be that
// lock's current grant. It returns the key's new fence. Repeating a write
// with the same token does the same thing, so it is repeated through
// leader changes.
func (c *Client) Put(ctx context.Context, key, value string, token uint64, lock string) (uint64, error) {
	var answer struct {
		Fence uint64 `json:"fence"`
	}
	err := c.call(ctx, post("/v1/store/put", storeBody{Key: key, Value: value, Token: token, Lock: lock}), &answer)
	return answer.Fence, err
}

// Get reads key. With a token (not 0), a fenced read: it raises the key's
// fence to token first, so no older holder can write after it; with lock
// not empty, token must be that lock's current grant.
func (c *Client) Get(ctx context.Context, key string, token uint64, lock string) (Stored, error) {
	var answer Stored
	r := get("/v1/store/get", queryOf("key", key))
	if token != 0 || lock != "" {
		r = post("/v1/store/get", storeBody{Key: key, Token: token, Lock: lock})
	}
	err := c.call(ctx, r, &answer)
	return answer, err
}

// Delete deletes key (fenced as Put); whether it had a value.
func (c *Client) Delete(ctx context.Context, key string, token uint64) (bool, error) {
	var answer struct {
		Existed bool `json:"existed"`
	}
	err := c.call(ctx, post("/v1/store/delete", storeBody{Key: key, Token: token}), &answer)
	return answer.Existed, err
}
