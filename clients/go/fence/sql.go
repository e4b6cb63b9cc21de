package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Placeholders is how a database/sql driver numbers its parameters.
type Placeholders int

const (
	// Dollar is PostgreSQL's $1, $2, ... (lib/pq, pgx's stdlib).
	Dollar Placeholders = iota
	// Question is ?, ?, ... (MySQL, SQLite).
	Question
)

// ErrMissing: a fenced update matched no row, and not because of its
// fence: there is no row with that key.
var ErrMissing = errors.New("fence: no row to update: the fenced update matched none, and not because of the fence")

// ErrTokenOutOfRange: the token does not fit in a signed 64-bit column.
var ErrTokenOutOfRange = errors.New("fence: the fencing token does not fit in a BIGINT (at most 9223372036854775807); refused rather than wrapped to a negative number")

// Execer is what Table needs of a *sql.DB, *sql.Tx or *sql.Conn.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Table makes fenced row updates through database/sql: the token check
// and the write are one UPDATE, so the database itself refuses a stale
// holder, whatever the order in which writers reach it.
//
// Each fenced row carries the highest token that wrote it:
//
//	ALTER TABLE files ADD COLUMN fence BIGINT NOT NULL DEFAULT 0;
//
// and Update runs
//
//	UPDATE files SET data = $1, fence = $2 WHERE id = $3 AND fence <= $2
//
// One row updated: the token was current, and the row now remembers it.
// Zero rows: the row's fence is higher (a *StaleError naming both tokens,
// read by a second query), or there is no such row (ErrMissing). <= and
// not <: a holder writes as often as it likes with its one token.
type Table struct {
	// Name is the table's name.
	Name string
	// Key is the key column (default "id"); Fence the fence column
	// (default "fence").
	Key, Fence string
	// Placeholders is the driver's parameter style (default Dollar).
	Placeholders Placeholders
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$`)

func (t Table) names() (table, key, fence string, err error) {
	table, key, fence = t.Name, t.Key, t.Fence
	if key == "" {
		key = "id"
	}
	if fence == "" {
		fence = "fence"
	}
	for _, name := range []string{table, key, fence} {
		if !identifier.MatchString(name) {
			return "", "", "", fmt.Errorf("fence: %q is not a plain SQL identifier", name)
		}
	}
	return table, key, fence, nil
}

func (t Table) placeholder(n int) string {
	if t.Placeholders == Question {
		return "?"
	}
	return "$" + strconv.Itoa(n)
}

// Update sets the columns of the row whose key is key, fenced by token:
// nil if written, a *StaleError if the row holds a higher token, or
// ErrMissing if there is no such row. Column names must be plain
// identifiers; values go as parameters.
func (t Table) Update(ctx context.Context, db Execer, key any, token uint64, columns map[string]any) error {
	table, keyColumn, fence, err := t.names()
	if err != nil {
		return err
	}
	if token > math.MaxInt64 {
		return ErrTokenOutOfRange
	}
	names := make([]string, 0, len(columns))
	for name := range columns {
		if !identifier.MatchString(name) || name == fence {
			return fmt.Errorf("fence: cannot set column %q", name)
		}
		names = append(names, name)
	}
	sort.Strings(names)
	var set []string
	var args []any
	for _, name := range names {
		args = append(args, columns[name])
		set = append(set, name+" = "+t.placeholder(len(args)))
	}
	args = append(args, int64(token))
	tokenAt := t.placeholder(len(args))
	set = append(set, fence+" = "+tokenAt)
	args = append(args, key)
	keyAt := t.placeholder(len(args))
	if t.Placeholders == Question {
		args = append(args, int64(token))
	}
	query := fmt.Sprintf("UPDATE %s SET %s WHERE %s = %s AND %s <= %s",
		table, strings.Join(set, ", "), keyColumn, keyAt, fence, t.tokenAgain(tokenAt, len(args)))
	result, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return err
	}
	if updated, err := result.RowsAffected(); err != nil || updated > 0 {
		return err
	}
	var current int64
	err = db.QueryRowContext(ctx, fmt.Sprintf("SELECT %s FROM %s WHERE %s = %s", fence, table, keyColumn, t.placeholder(1)), key).Scan(&current)
	if errors.Is(err, sql.ErrNoRows) {
		return ErrMissing
	}
	if err != nil {
		return err
	}
	if current > int64(token) {
		return &StaleError{Presented: token, Accepted: uint64(current)}
	}
	// Neither stale nor missing: the row changed between the two queries.
	return fmt.Errorf("fence: the fenced update of %s %v matched no row, though its fence %d admits token %d (written meanwhile?)", table, key, current, token)
}

// tokenAgain is the token's second use: $n again, or another ?.
func (t Table) tokenAgain(first string, count int) string {
	if t.Placeholders == Question {
		return t.placeholder(count)
	}
	return first
}
