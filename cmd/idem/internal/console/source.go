package console

import (
	"context"
	"errors"
	"time"

	"github.com/idemhq/idem/idemstore"
)

// Source is the console's whole view of a records store: what the pages
// read and the actions change. It is the one seam between the console and
// the stores: a store feature the console uses (a cursor on
// idemstore.Inspector.List, a new record state) changes an adapter behind it,
// never the pages. The adapters are sqlSource (SQLite, PostgreSQL: keyset
// pages on their indexes) and inspectorSource (any idemstore.Inspector: Redis,
// Redis Cluster, memory, stores added later).
//
// Every method is bounded by its context; times are decided as the store
// decides them (now for SQLite and memory, the server's clock for
// PostgreSQL and Redis).
type Source interface {
	// Summary counts the records in flight (by lease and suspension) and
	// those expired awaiting cleanup, each up to SummaryCap, and finds the
	// oldest in-flight lease. It reads every record only on PostgreSQL,
	// which keeps no index of the records in flight (sqlSource).
	Summary(ctx context.Context, now time.Time) (Summary, error)
	// Total counts every record, expired or not (Exact false: an
	// estimate). It may read the whole table; the console calls it in the
	// background and caches it.
	Total(ctx context.Context) (n int64, exact bool, err error)
	// List returns one page of records, without responses.
	List(ctx context.Context, q Query, now time.Time) (Page, error)
	// Find returns the unexpired records holding key, in scope or, when
	// scope is empty, in every scope the store can search; note says how
	// the search was bounded, if it was.
	Find(ctx context.Context, scope, key string, now time.Time) (rows []Row, note string, err error)
	// Get returns a record with its stored response or checkpoint (as
	// stored, possibly sealed), or idemstore.ErrNotFound.
	Get(ctx context.Context, r Ref, now time.Time) (Row, error)
	// Delete deletes a completed record whose fence is fence (0: not
	// checked); ErrChanged if it is in flight or another record now.
	Delete(ctx context.Context, r Ref, fence int64, now time.Time) error
	// Release deletes an in-flight record whose lease ended and whose
	// fence is fence (0: not checked); ErrChanged if its lease is live
	// or it changed hands.
	Release(ctx context.Context, r Ref, fence int64, now time.Time) error
	// RefOf returns the Ref of a record id the console did not list,
	// when the store can open records by id (Redis); false otherwise.
	RefOf(id string) (Ref, bool)
	// ID returns the console's id of a row (see RecordID).
	ID(r Row) string
	// Describe tells the pages what the store can do.
	Describe() SourceInfo
}

// SourceInfo says what a Source can do.
type SourceInfo struct {
	// Kind names the backend ("SQLite", "PostgreSQL", "Redis", ...).
	Kind string
	// Hashed is set when the store keeps scopes and keys only hashed:
	// lists show ids, and Find needs the scope.
	Hashed bool
	// Sorted is set when List sorts in-flight records by lease end and
	// aged ones by expiry (sqlSource, on its indexes); otherwise pages
	// follow the store's own cursor, in its order (inspectorSource), and
	// the overview's counts read at most MaxScan records.
	Sorted bool
	// Steps is set when records can hold recovery points.
	Steps bool
}

// ErrChanged is returned by Delete and Release when the record is no
// longer what the operator confirmed: its state, lease or fence changed.
var ErrChanged = errors.New("console: the record changed since it was confirmed (another action, perhaps from another tab, or a new claim): nothing was done")

// SummaryCap bounds each count of Summary: past it the page says "more
// than". It keeps the overview's cost bounded on any store.
const SummaryCap = 10_000

// MaxScan bounds the records a Source without cursor paging reads for one
// page (inspectorSource).
const MaxScan = 1000

// Summary is the overview's counts.
type Summary struct {
	// InFlight counts the unexpired records in flight; LeaseLive those
	// whose lease has not ended (an attempt is running); Suspended those
	// holding a recovery point whose lease ended (stopped after a step);
	// Abandoned the others whose lease ended (their owner is gone).
	InFlight, LeaseLive, Suspended, Abandoned int64
	// Expired counts the records whose retention ended and that cleanup
	// has not deleted yet.
	Expired int64
	// Capped is set when a count reached SummaryCap.
	Capped bool
	// Oldest is the in-flight record whose lease ended first (or ends
	// soonest), nil when none is in flight.
	Oldest *Row
}

// State is a Records filter.
type State string

// The filters of the Records page.
const (
	AnyState       State = ""
	StateInFlight  State = "in-flight"
	StateSuspended State = "suspended"
	// StateHeld selects the suspended records that reconciliation gave
	// up on, held for an operator (idemstore.Record.Held).
	StateHeld      State = "held"
	StateCompleted State = "completed"
	StateExpired   State = "expired"
)

// Query is a Records page request.
type Query struct {
	State State
	// Scope, if set, selects one scope.
	Scope string
	// Before, if set, selects records whose retention ends before it
	// (the records claimed before Before minus the TTL: an age filter).
	Before time.Time
	// After is the position to continue from (nil: the first page).
	After *Cursor
	Limit int
}

// Cursor is a position in a Records listing: the last row shown, by its
// sort value (a lease end or expiry in Unix nanoseconds, or 0 when sorted
// by scope and key) and its name, or, for inspectorSource, the store's
// own cursor (idemstore.ListPage.Next).
type Cursor struct {
	Sort       int64
	Scope, Key string
	Token      string
}

// Page is one page of records.
type Page struct {
	Rows []Row
	// Next continues the listing; nil at its end.
	Next *Cursor
	// Index names what served the query (for operators and the docs).
	Index string
	// Note says how the listing was bounded, if it was.
	Note string
}

// Row is a record as the console shows it.
type Row struct {
	idemstore.RecordInfo
	// HasCheckpoint reports a recovery point (in flight).
	HasCheckpoint bool
	// Owner is a short digest of the owner token of an in-flight record
	// (never the token), "" when the store does not tell.
	Owner string
}

// Ref returns the Ref that names r.
func (r Row) Ref() Ref {
	if r.Scope == "" && r.Key == "" && r.ID != "" {
		return Ref{StoreID: r.ID}
	}
	return Ref{Scope: r.Scope, Key: r.Key}
}

// leaseEnded reports whether an in-flight record's lease ended by now.
func (r Row) leaseEnded(now time.Time) bool {
	return r.State == idemstore.StateInFlight && !r.LeaseExpiresAt.After(now)
}

// Suspended reports an in-flight record stopped after a step.
func (r Row) suspended(now time.Time) bool { return r.HasCheckpoint && r.leaseEnded(now) }
