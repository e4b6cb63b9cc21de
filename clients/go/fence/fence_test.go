package fence_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	deadbolt "github.com/deadbolt/deadbolt-go"
	"github.com/deadbolt/deadbolt-go/fence"
)

func TestGate(t *testing.T) {
	var gate fence.Gate
	if err := gate.Admit(33); err != nil {
		t.Fatal(err)
	}
	if err := gate.Admit(34); err != nil {
		t.Fatal(err)
	}
	err := gate.Admit(33)
	if err == nil || err.Error() != "stale fencing token 33: this resource already accepted token 34" {
		t.Fatal(err)
	}
	if !errors.Is(err, deadbolt.ErrStaleToken) || !fence.IsStale(err) {
		t.Fatal("not ErrStaleToken")
	}
	if err := gate.Admit(34); err != nil {
		t.Fatal("the same token twice:", err)
	}
	wrote := false
	if err := gate.AdmitWith(33, func() error { wrote = true; return nil }); err == nil || wrote {
		t.Fatal("a stale write ran")
	}
	if gate.Mark() != 34 || fence.NewGate(7).Mark() != 7 {
		t.Fatal(gate.Mark())
	}
}

func TestMiddleware(t *testing.T) {
	gate := fence.NewGate(0)
	handler := fence.Middleware(gate, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, _ := fence.TokenFrom(r.Context())
		_, _ = io.WriteString(w, "written with "+strings.TrimSpace(r.Header.Get(fence.Header)))
		_ = token
	}))
	server := httptest.NewServer(handler)
	defer server.Close()
	send := func(tokens ...string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, server.URL, nil)
		for _, token := range tokens {
			req.Header.Add(fence.Header, token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(body))
	}
	for _, c := range []struct {
		tokens []string
		status int
		body   string
	}{
		{[]string{"7"}, 200, "written with 7"},
		{[]string{"9"}, 200, "written with 9"},
		{[]string{"9"}, 200, "written with 9"},
		{[]string{"8"}, 409, "stale fencing token 8: this resource already accepted token 9"},
		{nil, 400, "missing Fencing-Token header"},
		{[]string{"10", "11"}, 400, "more than one Fencing-Token header"},
		{[]string{"+10"}, 400, "malformed Fencing-Token header: expected a decimal integer below 2^64"},
		{[]string{"18446744073709551616"}, 400, "malformed Fencing-Token header: expected a decimal integer below 2^64"},
	} {
		status, body := send(c.tokens...)
		if status != c.status || body != c.body {
			t.Errorf("%v: %d %q, want %d %q", c.tokens, status, body, c.status, c.body)
		}
	}
	open := httptest.NewServer(fence.Middleware(gate, http.NotFoundHandler(), fence.AllowMissing()))
	defer open.Close()
	resp, err := http.Get(open.URL)
	if err != nil || resp.StatusCode != 404 {
		t.Fatal(resp, err)
	}
	resp.Body.Close()
	req, _ := http.NewRequest(http.MethodGet, open.URL, nil)
	fence.SetToken(req, 3)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 409 {
		t.Fatal(resp, err)
	}
	resp.Body.Close()
}

// rows is a fake database/sql driver with one table of (id, data, fence),
// which understands exactly the two statements fence.Table sends.
type rows struct {
	mu      sync.Mutex
	fences  map[int64]int64
	data    map[int64]string
	queries []string
}

func (db *rows) Open(string) (driver.Conn, error) { return conn{db}, nil }

type conn struct{ db *rows }

func (c conn) Prepare(query string) (driver.Stmt, error) { return stmt{c.db, query}, nil }
func (c conn) Close() error                              { return nil }
func (c conn) Begin() (driver.Tx, error)                 { return nil, errors.New("no transactions") }

type stmt struct {
	db    *rows
	query string
}

func (s stmt) Close() error  { return nil }
func (s stmt) NumInput() int { return -1 }

func (s stmt) Exec(args []driver.Value) (driver.Result, error) {
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	db.queries = append(db.queries, s.query)
	// UPDATE files SET data = $1, fence = $2 WHERE id = $3 AND fence <= $2
	data, token, id := args[0].(string), args[1].(int64), args[2].(int64)
	current, ok := db.fences[id]
	if !ok || current > token {
		return driver.RowsAffected(0), nil
	}
	db.fences[id], db.data[id] = token, data
	return driver.RowsAffected(1), nil
}

func (s stmt) Query(args []driver.Value) (driver.Rows, error) {
	db := s.db
	db.mu.Lock()
	defer db.mu.Unlock()
	db.queries = append(db.queries, s.query)
	current, ok := db.fences[args[0].(int64)]
	return &result{values: current, ok: ok}, nil
}

type result struct {
	values int64
	ok     bool
}

func (r *result) Columns() []string { return []string{"fence"} }
func (r *result) Close() error      { return nil }
func (r *result) Next(dest []driver.Value) error {
	if !r.ok {
		return io.EOF
	}
	r.ok = false
	dest[0] = r.values
	return nil
}

func TestTable(t *testing.T) {
	fake := &rows{fences: map[int64]int64{7: 0}, data: map[int64]string{}}
	sql.Register("fence-fake", fake)
	db, err := sql.Open("fence-fake", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	files := fence.Table{Name: "files"}
	if err := files.Update(ctx, db, int64(7), 34, map[string]any{"data": "B's report"}); err != nil {
		t.Fatal(err)
	}
	if fake.queries[0] != "UPDATE files SET data = $1, fence = $2 WHERE id = $3 AND fence <= $2" {
		t.Fatal(fake.queries[0])
	}
	err = files.Update(ctx, db, int64(7), 33, map[string]any{"data": "A's late report"})
	var stale *fence.StaleError
	if !errors.As(err, &stale) || stale.Presented != 33 || stale.Accepted != 34 {
		t.Fatalf("a stale update: %v", err)
	}
	if fake.data[7] != "B's report" {
		t.Fatal("the stale holder wrote")
	}
	if err := files.Update(ctx, db, int64(8), 35, map[string]any{"data": "x"}); !errors.Is(err, fence.ErrMissing) {
		t.Fatalf("a missing row: %v", err)
	}
	if err := files.Update(ctx, db, int64(7), 1<<63, nil); !errors.Is(err, fence.ErrTokenOutOfRange) {
		t.Fatal(err)
	}
	if err := (fence.Table{Name: "files; DROP TABLE x"}).Update(ctx, db, 1, 1, nil); err == nil {
		t.Fatal("an injected table name")
	}
	mysql := fence.Table{Name: "files", Placeholders: fence.Question}
	_ = mysql.Update(ctx, db, int64(9), 36, map[string]any{"data": "y"})
	if !strings.HasPrefix(fake.queries[len(fake.queries)-2], "UPDATE files SET data = ?, fence = ? WHERE id = ? AND fence <= ?") {
		t.Fatal(fake.queries)
	}
}
