package console

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// sqlSource reads a SQLite or PostgreSQL records table directly, with
// read-only keyset queries on the table's indexes (their columns are
// described by the stores' migrations; the console's tests run on both
// real stores), and changes records only through the store's own methods.
//
// Which index serves which listing:
//
//	no filter, scope, completed     the primary key (scope, key)
//	in flight, suspended, held      SQLite: the in-flight index (lease end, then scope, key)
//	suspended, held                 PostgreSQL: the index of the records holding a
//	                                recovery point (pgstore migration 5), then a sort
//	in flight                       PostgreSQL: the table, read in full, keeping the
//	                                page's rows by lease end (a top-N sort)
//	expired, age (Query.Before)     the expiry index (expires_at, then scope, key)
//
// pgstore keeps no index of the records in flight, so that completions
// are heap-only updates: the in-flight listing, the overview's in-flight
// counts and its oldest lease read the whole table, bounded in what they
// return (LIMIT), not in what they read. An operator who adds the index
// docs/console.md names gets index reads from the same statements. A
// second filter (a scope with a state, an age with a state) is checked on
// the rows the index yields.
type sqlSource struct {
	d     dialect
	table string
	// inspector deletes, through the store's own atomic Delete.
	inspector idemstore.Inspector
	// release releases an in-flight record with its owner token (the
	// store's fenced Release).
	release func(ctx context.Context, p idemstore.ReleaseParams) error
	kind    string
}

// dialect hides the differences of the two SQL stores' tables.
type dialect interface {
	// query and queryRow run a read-only statement.
	query(ctx context.Context, q string, args ...any) (rows, error)
	// now is the SQL for the store's clock, with its argument (if any).
	now(b *argList, now time.Time) string
	// timeArg converts a time to the table's representation.
	timeArg(t time.Time) any
	// inFlight and completed are the state conditions.
	inFlight() string
	completed() string
	// lease is the lease-end column; size the response size expression.
	lease() string
	size() string
	// scanTime reads a time column into Unix nanoseconds.
	scanTime() timeScanner
	// placeholder returns the n-th (1-based) argument's placeholder.
	placeholder(n int) string
	// anyOf returns the condition "col is one of the list" for list.
	anyOf(b *argList, col string, list []string) string
	// inFlightIndex names what serves the listing of state (in flight,
	// suspended or held), for the page.
	inFlightIndex(state State) string
	// indexed returns the clause after the table's name that makes the
	// query use the named index (inflight, expires or "" for the primary
	// key): SQLite's planner has no statistics of the table and may
	// otherwise read the expiry index for an in-flight query, row by row
	// (seconds on 1M records). PostgreSQL plans from its statistics.
	indexed(table, index string) string
}

type rows interface {
	Next() bool
	Scan(...any) error
	Err() error
	Close()
}

// timeScanner is a scan target for a time column that may be NULL.
type timeScanner interface {
	target() any
	nanos() int64
}

// argList builds a statement's arguments and placeholders.
type argList struct {
	d    dialect
	args []any
}

func (b *argList) add(v any) string {
	b.args = append(b.args, v)
	return b.d.placeholder(len(b.args))
}

// newSQLiteSource returns the Source of a SQLite records store.
func newSQLiteSource(s *sqlitestore.Store) *sqlSource {
	return &sqlSource{d: sqliteDialect{db: s.ReadDB()}, table: s.Table(), inspector: s, release: s.Release, kind: "SQLite"}
}

// newPGSource returns the Source of a PostgreSQL records store.
func newPGSource(s *pgstore.Store, pool *pgxpool.Pool) *sqlSource {
	return &sqlSource{d: pgDialect{pool: pool}, table: s.Table(), inspector: s, release: s.Release, kind: "PostgreSQL"}
}

// columns are the columns of a Row, in scanRow's order.
func (s *sqlSource) columns() string {
	return `scope, key, fingerprint, ` + s.d.inFlight() + `, ` + s.d.lease() + `, expires_at, ` + s.d.size() +
		`, checkpoint IS NOT NULL, fence`
}

func (s *sqlSource) scanRow(r interface{ Scan(...any) error }, extra ...any) (Row, error) {
	var (
		row      Row
		inFlight bool
		lease    = s.d.scanTime()
		expires  = s.d.scanTime()
	)
	dst := append([]any{&row.Scope, &row.Key, &row.Fingerprint, &inFlight, lease.target(), expires.target(),
		&row.ResponseSize, &row.HasCheckpoint, &row.Fence}, extra...)
	if err := r.Scan(dst...); err != nil {
		return row, err
	}
	row.ExpiresAt = time.Unix(0, expires.nanos()).UTC()
	row.State = idemstore.StateCompleted
	if inFlight {
		row.State = idemstore.StateInFlight
		row.LeaseExpiresAt = time.Unix(0, lease.nanos()).UTC()
		row.ResponseSize = 0
	}
	return row, nil
}

func (s *sqlSource) Describe() SourceInfo {
	return SourceInfo{Kind: s.kind, Sorted: true, Steps: true}
}

func (s *sqlSource) RefOf(string) (Ref, bool) { return Ref{}, false }

func (s *sqlSource) ID(r Row) string { return RecordID(r.Scope, r.Key) }

// Summary implements Source: the expired count reads the expiry index; the
// in-flight counts and the oldest lease read SQLite's in-flight index, and
// PostgreSQL's table (see sqlSource). Each count stops at SummaryCap.
func (s *sqlSource) Summary(ctx context.Context, now time.Time) (Summary, error) {
	var sum Summary
	q := s.summarySQL(now)
	_, pg := s.d.(pgDialect)
	if pg {
		// One read of the table for the counts and the oldest lease.
		if err := s.pgInFlight(ctx, q[3], &sum); err != nil {
			return sum, fmt.Errorf("count in flight: %w", err)
		}
	} else if err := s.one(ctx, q[0].stmt, q[0].args, &sum.InFlight, &sum.LeaseLive, &sum.Suspended); err != nil {
		return sum, fmt.Errorf("count in flight: %w", err)
	}
	sum.Abandoned = sum.InFlight - sum.LeaseLive - sum.Suspended
	if err := s.one(ctx, q[1].stmt, q[1].args, &sum.Expired); err != nil {
		return sum, fmt.Errorf("count expired: %w", err)
	}
	sum.Capped = sum.InFlight >= SummaryCap || sum.Expired >= SummaryCap
	if pg && sum.InFlight < SummaryCap {
		// The count saw every record in flight, and so their oldest.
		return sum, nil
	}
	sum.Oldest = nil
	rs, err := s.d.query(ctx, q[2].stmt, q[2].args...)
	if err != nil {
		return sum, fmt.Errorf("oldest lease: %w", err)
	}
	defer rs.Close()
	if rs.Next() {
		r, err := s.scanRow(rs)
		if err != nil {
			return sum, fmt.Errorf("oldest lease: %w", err)
		}
		sum.Oldest = &r
	}
	return sum, rs.Err()
}

// statement is a query with its arguments.
type statement struct {
	stmt string
	args []any
}

// pgInFlight reads the in-flight counts and the oldest of the records
// counted into sum, with q (summarySQL's fourth statement): one row, the
// oldest, carrying the counts; none when nothing is in flight.
func (s *sqlSource) pgInFlight(ctx context.Context, q statement, sum *Summary) error {
	rs, err := s.d.query(ctx, q.stmt, q.args...)
	if err != nil {
		return err
	}
	defer rs.Close()
	if rs.Next() {
		r, err := s.scanRow(rs, &sum.InFlight, &sum.LeaseLive, &sum.Suspended)
		if err != nil {
			return err
		}
		sum.Oldest = &r
	}
	return rs.Err()
}

// summarySQL returns Summary's queries: the in-flight counts, the expired
// count, the oldest lease and, on PostgreSQL, the in-flight counts with
// the oldest of the records counted, in one read of the table (the
// oldest lease's statement then runs only when the count was capped).
func (s *sqlSource) summarySQL(now time.Time) [4]statement {
	var out [4]statement
	b := &argList{d: s.d}
	nowSQL := s.d.now(b, now)
	out[0] = statement{`SELECT count(*), coalesce(sum(CASE WHEN lease > ` + nowSQL + ` THEN 1 ELSE 0 END), 0),
		coalesce(sum(CASE WHEN lease <= ` + nowSQL + ` AND cp THEN 1 ELSE 0 END), 0)
		FROM (SELECT ` + s.d.lease() + ` AS lease, checkpoint IS NOT NULL AS cp FROM ` + s.table + s.d.indexed(s.table, "inflight") +
		` WHERE ` + s.d.inFlight() + ` AND expires_at > ` + nowSQL + ` LIMIT ` + strconv.Itoa(SummaryCap) + `) AS f`, b.args}
	b = &argList{d: s.d}
	nowSQL = s.d.now(b, now)
	out[1] = statement{`SELECT count(*) FROM (SELECT 1 FROM ` + s.table + s.d.indexed(s.table, "expires") + ` WHERE expires_at <= ` + nowSQL +
		` LIMIT ` + strconv.Itoa(SummaryCap) + `) AS e`, b.args}
	b = &argList{d: s.d}
	nowSQL = s.d.now(b, now)
	out[2] = statement{`SELECT ` + s.columns() + ` FROM ` + s.table + s.d.indexed(s.table, "inflight") + ` WHERE ` + s.d.inFlight() +
		` AND expires_at > ` + nowSQL + ` ORDER BY ` + s.d.lease() + ` LIMIT 1`, b.args}
	if _, ok := s.d.(pgDialect); ok {
		// The columns of a Row (scanRow), then the counts over every
		// row the subquery read.
		out[3] = statement{`SELECT scope, key, fingerprint, true, lease_expires_at, expires_at, 0, cp, fence,
		count(*) OVER (), sum(CASE WHEN lease_expires_at > statement_timestamp() THEN 1 ELSE 0 END) OVER (),
		sum(CASE WHEN lease_expires_at <= statement_timestamp() AND cp THEN 1 ELSE 0 END) OVER ()
		FROM (SELECT scope, key, fingerprint, lease_expires_at, expires_at, checkpoint IS NOT NULL AS cp, fence FROM ` + s.table +
			` WHERE ` + s.d.inFlight() + ` AND expires_at > statement_timestamp() LIMIT ` + strconv.Itoa(SummaryCap) + `) AS f
		ORDER BY lease_expires_at LIMIT 1`, nil}
	}
	return out
}

// errNoRow is one's error for a query that returned no row.
var errNoRow = errors.New("no row")

// one runs a query that returns one row.
func (s *sqlSource) one(ctx context.Context, q string, args []any, dst ...any) error {
	rs, err := s.d.query(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rs.Close()
	if !rs.Next() {
		if err := rs.Err(); err != nil {
			return err
		}
		return errNoRow
	}
	if err := rs.Scan(dst...); err != nil {
		return err
	}
	return rs.Err()
}

// Total implements Source: an exact count on SQLite (the smallest index;
// 86 ms on 1M records here), the planner's estimate on PostgreSQL when it
// is over SummaryCap rows (an exact count then reads the table).
func (s *sqlSource) Total(ctx context.Context) (int64, bool, error) {
	var n int64
	if pg, ok := s.d.(pgDialect); ok {
		var est float64
		if err := pg.pool.QueryRow(ctx, `SELECT coalesce(reltuples, -1) FROM pg_class WHERE oid = to_regclass($1)`, s.table).Scan(&est); err != nil {
			return 0, false, fmt.Errorf("estimate: %w", err)
		}
		if est > SummaryCap {
			return int64(est), false, nil
		}
	}
	if err := s.one(ctx, `SELECT count(*) FROM `+s.table, nil, &n); err != nil {
		return 0, false, fmt.Errorf("count: %w", err)
	}
	return n, true, nil
}

// List implements Source with one keyset query per page (see sqlSource).
func (s *sqlSource) List(ctx context.Context, q Query, now time.Time) (Page, error) {
	stmt, args, sortCol, index := s.listSQL(q, now)
	rs, err := s.d.query(ctx, stmt, args...)
	if err != nil {
		return Page{}, fmt.Errorf("list: %w", err)
	}
	defer rs.Close()
	p := Page{Index: index}
	for rs.Next() {
		r, err := s.scanRow(rs)
		if err != nil {
			return Page{}, fmt.Errorf("list: %w", err)
		}
		p.Rows = append(p.Rows, r)
	}
	if err := rs.Err(); err != nil {
		return Page{}, fmt.Errorf("list: %w", err)
	}
	if len(p.Rows) > q.Limit {
		p.Rows = p.Rows[:q.Limit]
		last := p.Rows[len(p.Rows)-1]
		c := &Cursor{Scope: last.Scope, Key: last.Key}
		switch sortCol {
		case "expires_at":
			c.Sort = last.ExpiresAt.UnixNano()
		case "":
		default:
			c.Sort = last.LeaseExpiresAt.UnixNano()
		}
		p.Next = c
	}
	return p, nil
}

// listSQL returns List's statement and arguments, the column it sorts by
// before scope and key ("" for none) and the index that serves it.
func (s *sqlSource) listSQL(q Query, now time.Time) (stmt string, args []any, sortCol, index string) {
	b := &argList{d: s.d}
	nowSQL := s.d.now(b, now)
	var where []string
	var order []string
	var hint string
	switch {
	case q.State == StateInFlight || q.State == StateSuspended || q.State == StateHeld:
		sortCol, index, hint = s.d.lease(), s.d.inFlightIndex(q.State), "inflight"
		where = append(where, s.d.inFlight(), "expires_at > "+nowSQL)
		switch q.State {
		case StateSuspended:
			where = append(where, "checkpoint IS NOT NULL", s.d.lease()+" <= "+nowSQL)
		case StateHeld:
			// A held record's lease ends at the Unix epoch: the first
			// rows of SQLite's in-flight index.
			where = append(where, "checkpoint IS NOT NULL", s.d.lease()+" = "+b.add(s.d.timeArg(time.Unix(0, 0))))
		}
	case q.State == StateExpired:
		sortCol, index, hint = "expires_at", "expiry index (expires_at)", "expires"
		where = append(where, "expires_at <= "+nowSQL)
	case !q.Before.IsZero():
		sortCol, index, hint = "expires_at", "expiry index (expires_at)", "expires"
		where = append(where, "expires_at > "+nowSQL)
		if q.State == StateCompleted {
			where = append(where, s.d.completed())
		}
	default:
		index = "primary key (scope, key)"
		where = append(where, "expires_at > "+nowSQL)
		if q.State == StateCompleted {
			where = append(where, s.d.completed())
		}
	}
	if !q.Before.IsZero() {
		where = append(where, "expires_at < "+b.add(s.d.timeArg(q.Before)))
	}
	if q.Scope != "" {
		where = append(where, "scope = "+b.add(q.Scope))
	}
	if sortCol != "" {
		order = append(order, sortCol)
	}
	order = append(order, "scope", "key")
	if c := q.After; c != nil {
		if sortCol != "" {
			where = append(where, "("+sortCol+", scope, key) > ("+b.add(s.d.timeArg(time.Unix(0, c.Sort)))+", "+
				b.add(c.Scope)+", "+b.add(c.Key)+")")
		} else {
			where = append(where, "(scope, key) > ("+b.add(c.Scope)+", "+b.add(c.Key)+")")
		}
	}
	stmt = `SELECT ` + s.columns() + ` FROM ` + s.table + s.d.indexed(s.table, hint) + ` WHERE ` + strings.Join(where, " AND ") +
		` ORDER BY ` + strings.Join(order, ", ") + ` LIMIT ` + b.add(q.Limit+1)
	return stmt, b.args, sortCol, index
}

// maxFindScopes bounds the scopes Find probes one by one; past it, Find
// reads every row (the table has no index on the key alone).
const maxFindScopes = 1000

// Find implements Source. Without a scope it walks the distinct scopes on
// the primary key (one index seek per scope) and looks the key up in each,
// so that it stays an index read on a large table with few scopes.
func (s *sqlSource) Find(ctx context.Context, scope, key string, now time.Time) ([]Row, string, error) {
	b := &argList{d: s.d}
	nowSQL := s.d.now(b, now)
	where := "key = " + b.add(key) + " AND expires_at > " + nowSQL
	note := ""
	switch {
	case scope != "":
		where += " AND scope = " + b.add(scope)
	default:
		scopes, err := s.scopes(ctx, maxFindScopes+1)
		if err != nil {
			return nil, "", err
		}
		if len(scopes) > maxFindScopes {
			note = fmt.Sprintf("The store holds more than %d scopes: the search read every record; give the scope to make it an index lookup.", maxFindScopes)
		} else if len(scopes) == 0 {
			return nil, "", nil
		} else {
			where += " AND " + s.d.anyOf(b, "scope", scopes)
		}
	}
	rs, err := s.d.query(ctx, `SELECT `+s.columns()+` FROM `+s.table+` WHERE `+where+` ORDER BY scope LIMIT 100`, b.args...)
	if err != nil {
		return nil, "", fmt.Errorf("find: %w", err)
	}
	defer rs.Close()
	var out []Row
	for rs.Next() {
		r, err := s.scanRow(rs)
		if err != nil {
			return nil, "", fmt.Errorf("find: %w", err)
		}
		out = append(out, r)
	}
	if err := rs.Err(); err != nil {
		return nil, "", fmt.Errorf("find: %w", err)
	}
	return out, note, nil
}

// scopes returns up to limit distinct scopes, by a loose index scan of the
// primary key (a recursive query: one seek per scope).
func (s *sqlSource) scopes(ctx context.Context, limit int) ([]string, error) {
	t := s.table
	rs, err := s.d.query(ctx, `WITH RECURSIVE s(x) AS (
		SELECT (SELECT min(scope) FROM `+t+`)
		UNION ALL
		SELECT (SELECT min(scope) FROM `+t+` WHERE scope > s.x) FROM s WHERE s.x IS NOT NULL)
		SELECT x FROM s WHERE x IS NOT NULL LIMIT `+strconv.Itoa(limit))
	if err != nil {
		return nil, fmt.Errorf("scopes: %w", err)
	}
	defer rs.Close()
	var out []string
	for rs.Next() {
		var x string
		if err := rs.Scan(&x); err != nil {
			return nil, fmt.Errorf("scopes: %w", err)
		}
		out = append(out, x)
	}
	return out, rs.Err()
}

// Get implements Source: one primary-key read with the response, the
// checkpoint and a digest of the owner token.
func (s *sqlSource) Get(ctx context.Context, r Ref, now time.Time) (Row, error) {
	if !r.named() {
		return Row{}, idemstore.ErrNotFound
	}
	b := &argList{d: s.d}
	nowSQL := s.d.now(b, now)
	rs, err := s.d.query(ctx, `SELECT `+s.columns()+`, response, checkpoint, token FROM `+s.table+
		` WHERE scope = `+b.add(r.Scope)+` AND key = `+b.add(r.Key)+` AND expires_at > `+nowSQL, b.args...)
	if err != nil {
		return Row{}, fmt.Errorf("get: %w", err)
	}
	defer rs.Close()
	if !rs.Next() {
		if err := rs.Err(); err != nil {
			return Row{}, fmt.Errorf("get: %w", err)
		}
		return Row{}, idemstore.ErrNotFound
	}
	var resp, cp []byte
	var token *string
	row, err := s.scanRow(rs, &resp, &cp, &token)
	if err != nil {
		return Row{}, fmt.Errorf("get: %w", err)
	}
	if row.State == idemstore.StateCompleted {
		row.ResponseSize = len(resp)
		row.Response = new(idem.Response)
		if err := row.Response.UnmarshalBinary(resp); err != nil {
			return Row{}, fmt.Errorf("get: stored response: %w", err)
		}
	} else {
		row.Checkpoint = cp
		if token != nil {
			row.Owner = ownerDigest(*token)
		}
	}
	return row, rs.Err()
}

// ownerDigest is what the console shows of an owner token: enough to tell
// two owners apart, never enough to act as one.
func ownerDigest(token string) string {
	sum := sha256.Sum256([]byte("idem console owner\x00" + token))
	return hex.EncodeToString(sum[:6])
}

// Delete implements Source through the store's atomic Delete, which
// refuses a record in flight; the fence is checked just before.
func (s *sqlSource) Delete(ctx context.Context, r Ref, fence int64, now time.Time) error {
	row, err := s.Get(ctx, r, now)
	if err != nil {
		return err
	}
	if row.State != idemstore.StateCompleted || (fence != 0 && row.Fence != fence) {
		return ErrChanged
	}
	err = s.inspector.Delete(ctx, idemstore.DeleteParams{Scope: r.Scope, Key: r.Key, Now: now})
	if errors.Is(err, idem.ErrInFlight) {
		return ErrChanged
	}
	return err
}

// Release implements Source with the store's Release under the record's
// owner token, read just before: a claim that took the record over
// meanwhile has another token, and the store then releases nothing.
func (s *sqlSource) Release(ctx context.Context, r Ref, fence int64, now time.Time) error {
	if !r.named() {
		return idemstore.ErrNotFound
	}
	b := &argList{d: s.d}
	nowSQL := s.d.now(b, now)
	var token *string
	var got int64
	var ended bool
	err := s.one(ctx, `SELECT token, fence, `+s.d.lease()+` <= `+nowSQL+` FROM `+s.table+
		` WHERE scope = `+b.add(r.Scope)+` AND key = `+b.add(r.Key)+` AND `+s.d.inFlight()+` AND expires_at > `+nowSQL,
		b.args, &token, &got, &ended)
	switch {
	case errors.Is(err, errNoRow):
		return ErrChanged
	case err != nil:
		return fmt.Errorf("release: %w", err)
	case token == nil || !ended || (fence != 0 && got != fence):
		return ErrChanged
	}
	err = s.release(ctx, idemstore.ReleaseParams{Scope: r.Scope, Key: r.Key, Token: *token, Now: now})
	if errors.Is(err, idem.ErrLeaseLost) {
		return ErrChanged
	}
	return err
}

// sqliteDialect is the records table of sqlitestore: times in Unix
// nanoseconds of the core's clock, state 1 (in flight) or 2 (completed).
type sqliteDialect struct{ db *sql.DB }

func (d sqliteDialect) query(ctx context.Context, q string, args ...any) (rows, error) {
	rs, err := d.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rs}, nil
}

type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

func (sqliteDialect) now(b *argList, now time.Time) string { return b.add(now.UnixNano()) }
func (sqliteDialect) timeArg(t time.Time) any              { return t.UnixNano() }
func (sqliteDialect) inFlight() string                     { return "state = 1" }
func (sqliteDialect) completed() string                    { return "state = 2" }
func (sqliteDialect) lease() string                        { return "lease_until" }
func (sqliteDialect) size() string                         { return "coalesce(length(response), 0)" }
func (sqliteDialect) scanTime() timeScanner                { return new(nanoTime) }
func (sqliteDialect) placeholder(n int) string             { return "?" + strconv.Itoa(n) }

func (sqliteDialect) inFlightIndex(State) string { return "in-flight index (lease_until)" }

func (sqliteDialect) indexed(table, index string) string {
	switch index {
	case "inflight":
		return " INDEXED BY " + table + "_inflight"
	case "expires":
		return " INDEXED BY " + table + "_expires_at"
	}
	return " NOT INDEXED" // the primary key of a WITHOUT ROWID table
}

func (sqliteDialect) anyOf(b *argList, col string, list []string) string {
	ph := make([]string, len(list))
	for i, v := range list {
		ph[i] = b.add(v)
	}
	return col + " IN (" + strings.Join(ph, ", ") + ")"
}

type nanoTime struct{ n sql.NullInt64 }

func (t *nanoTime) target() any  { return &t.n }
func (t *nanoTime) nanos() int64 { return t.n.Int64 }

// pgDialect is the records table of pgstore: timestamptz columns and the
// server's clock (statement_timestamp()); a record is in flight while its
// token is set.
type pgDialect struct{ pool *pgxpool.Pool }

func (d pgDialect) query(ctx context.Context, q string, args ...any) (rows, error) {
	rs, err := d.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return pgRows{rs}, nil
}

type pgRows struct{ pgx.Rows }

func (pgDialect) now(*argList, time.Time) string { return "statement_timestamp()" }
func (pgDialect) timeArg(t time.Time) any        { return t }
func (pgDialect) inFlight() string               { return "token IS NOT NULL" }
func (pgDialect) completed() string              { return "token IS NULL" }
func (pgDialect) lease() string                  { return "lease_expires_at" }
func (pgDialect) size() string                   { return "coalesce(octet_length(response), 0)" }
func (pgDialect) scanTime() timeScanner          { return new(pgTime) }
func (pgDialect) placeholder(n int) string       { return "$" + strconv.Itoa(n) }

func (pgDialect) indexed(string, string) string { return "" }

func (pgDialect) inFlightIndex(st State) string {
	if st == StateInFlight {
		return "records table, read in full unless the optional in-flight index exists (docs/console.md)"
	}
	return "index of the records holding a recovery point (checkpoint)"
}

func (pgDialect) anyOf(b *argList, col string, list []string) string {
	return col + " = ANY(" + b.add(list) + ")"
}

type pgTime struct{ t *time.Time }

func (t *pgTime) target() any { return &t.t }
func (t *pgTime) nanos() int64 {
	if t.t == nil {
		return 0
	}
	return t.t.UnixNano()
}
