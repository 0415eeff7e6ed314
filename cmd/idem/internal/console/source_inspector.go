package console

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// inspectorSource is the Source of any store that implements
// idemstore.Inspector (Redis, Redis Cluster, memory, and stores added later).
// A listing follows the store's cursor (idemstore.ListParams.After) in the
// store's own order and filters in the console; the overview's counts read
// at most MaxScan records.
type inspectorSource struct {
	in   idemstore.Inspector
	ss   idemstore.StepStore // nil if the store keeps no recovery points
	byID idByID              // nil unless the store opens records by id
	kind string
	// idPrefix and idSuffix wrap a RecordID into the store's id
	// (redisstore: "prefix{" and "}").
	idPrefix, idSuffix string
}

// idByID is implemented by stores that open records by their own id
// (redisstore).
type idByID interface {
	GetByID(ctx context.Context, id string) (idemstore.RecordInfo, error)
	DeleteByID(ctx context.Context, id string, force bool) error
}

// keyNamer is implemented by stores whose ids derive from scope and key
// (redisstore.Store.Key).
type keyNamer interface {
	Key(scope, key string) string
}

func newInspectorSource(in idemstore.Inspector, kind string) *inspectorSource {
	s := &inspectorSource{in: in, kind: kind}
	s.ss, _ = in.(idemstore.StepStore)
	if b, ok := in.(idByID); ok {
		if n, ok := in.(keyNamer); ok {
			// The store's id of the empty name shows where the digest goes.
			full, tag := n.Key("", ""), RecordID("", "")
			if i := strings.Index(full, tag); i >= 0 {
				s.byID, s.idPrefix, s.idSuffix = b, full[:i], full[i+len(tag):]
			}
		}
	}
	return s
}

func (s *inspectorSource) Describe() SourceInfo {
	return SourceInfo{Kind: s.kind, Hashed: s.byID != nil, Steps: s.ss != nil}
}

// RefOf implements Source for stores that name records by the digest.
func (s *inspectorSource) RefOf(id string) (Ref, bool) {
	if s.byID == nil || !validID(id) {
		return Ref{}, false
	}
	return Ref{StoreID: s.idPrefix + id + s.idSuffix}, true
}

// ID implements Source: the RecordID of the row's name, or the digest in
// the store's id.
func (s *inspectorSource) ID(row Row) string {
	r := row.RecordInfo
	if r.Scope != "" || r.Key != "" || s.byID == nil {
		return RecordID(r.Scope, r.Key)
	}
	return strings.TrimSuffix(strings.TrimPrefix(r.ID, s.idPrefix), s.idSuffix)
}

// scan lists up to MaxScan unexpired records in state st.
func (s *inspectorSource) scan(ctx context.Context, st idemstore.RecordState, now time.Time) ([]idemstore.RecordInfo, error) {
	return s.listUpTo(ctx, idemstore.ListParams{State: st, Now: now}, MaxScan)
}

// listUpTo follows the store's cursor from the first page until it has
// max records or the walk ends.
func (s *inspectorSource) listUpTo(ctx context.Context, p idemstore.ListParams, max int) ([]idemstore.RecordInfo, error) {
	var recs []idemstore.RecordInfo
	for len(recs) < max {
		p.Limit = max - len(recs)
		page, err := s.in.List(ctx, p)
		if err != nil {
			return nil, err
		}
		recs = append(recs, page.Records...)
		if p.After = page.Next; p.After == "" {
			break
		}
	}
	return recs, nil
}

// Summary implements Source from the first MaxScan in-flight records and
// the store's stuck records; the store deletes expired ones itself or
// hides them, so none are counted.
func (s *inspectorSource) Summary(ctx context.Context, now time.Time) (Summary, error) {
	var sum Summary
	recs, err := s.scan(ctx, idemstore.StateInFlight, now)
	if err != nil {
		return sum, fmt.Errorf("list in flight: %w", err)
	}
	stuck := map[[2]string]bool{}
	if s.ss != nil {
		st, err := s.ss.Stuck(ctx, idemstore.StuckParams{Limit: MaxScan, Now: now})
		if err != nil {
			return sum, fmt.Errorf("stuck: %w", err)
		}
		for _, r := range st {
			stuck[[2]string{r.Scope, r.Key}] = true
		}
	}
	for _, r := range recs {
		sum.InFlight++
		switch {
		case r.LeaseExpiresAt.After(now):
			sum.LeaseLive++
		case stuck[[2]string{r.Scope, r.Key}]:
			sum.Suspended++
		default:
			sum.Abandoned++
		}
		if sum.Oldest == nil || r.LeaseExpiresAt.Before(sum.Oldest.LeaseExpiresAt) {
			row := s.row(r, stuck)
			sum.Oldest = &row
		}
	}
	sum.Capped = len(recs) >= MaxScan
	return sum, nil
}

func (s *inspectorSource) row(r idemstore.RecordInfo, stuck map[[2]string]bool) Row {
	return Row{RecordInfo: r, HasCheckpoint: len(r.Checkpoint) > 0 || stuck[[2]string{r.Scope, r.Key}]}
}

// Total implements Source with a bounded listing: at least the count, not
// more (Exact false past MaxScan).
func (s *inspectorSource) Total(ctx context.Context) (int64, bool, error) {
	recs, err := s.listUpTo(ctx, idemstore.ListParams{Now: time.Now()}, MaxScan)
	if err != nil {
		return 0, false, err
	}
	return int64(len(recs)), len(recs) < MaxScan, nil
}

// List implements Source with the store's cursor, in the store's order:
// each page reads at most MaxScan records of the store.
func (s *inspectorSource) List(ctx context.Context, q Query, now time.Time) (Page, error) {
	if q.State == StateExpired {
		return Page{Index: "none", Note: "This store hides expired records (Redis deletes them itself; memory deletes them on cleanup)."}, nil
	}
	if q.Scope != "" && s.byID != nil {
		return Page{}, errBadQuery("this store keeps scopes only hashed: it cannot filter by scope")
	}
	st := idemstore.RecordState(0)
	switch q.State {
	case StateInFlight, StateSuspended, StateHeld:
		st = idemstore.StateInFlight
	case StateCompleted:
		st = idemstore.StateCompleted
	}
	stuck := map[[2]string]bool{}
	if q.State == StateSuspended && s.ss != nil {
		sr, err := s.ss.Stuck(ctx, idemstore.StuckParams{Limit: MaxScan, Now: now})
		if err != nil {
			return Page{}, fmt.Errorf("stuck: %w", err)
		}
		for _, r := range sr {
			stuck[[2]string{r.Scope, r.Key}] = true
		}
	}
	p := Page{Index: "the store's own listing and cursor (" + s.kind + ")"}
	lp := idemstore.ListParams{State: st, Now: now}
	if q.After != nil {
		lp.After = q.After.Token
	}
	scanned := 0
	for calls := 0; ; calls++ {
		lp.Limit = min(q.Limit-len(p.Rows), MaxScan-scanned)
		page, err := s.in.List(ctx, lp)
		if errors.Is(err, idemstore.ErrInvalidCursor) {
			return Page{}, errBadQuery("after: the store no longer continues this listing (" + err.Error() + "): start from the first page")
		}
		if err != nil {
			return Page{}, fmt.Errorf("list: %w", err)
		}
		scanned += len(page.Records)
		for _, r := range page.Records {
			if q.Scope != "" && r.Scope != q.Scope || !q.Before.IsZero() && !r.ExpiresAt.Before(q.Before) {
				continue
			}
			row := s.row(r, stuck)
			if q.State == StateSuspended && !row.suspended(now) || q.State == StateHeld && !row.Held() {
				continue
			}
			p.Rows = append(p.Rows, row)
		}
		if page.Next == "" {
			return p, nil // the walk's end
		}
		// A page ends when it is full, or when it read MaxScan records
		// (or made maxListCalls calls) to find fewer: a filter that
		// matches few records costs each page a bounded read, and the
		// next page goes on from the store's cursor.
		if len(p.Rows) >= q.Limit || scanned >= MaxScan || calls+1 >= maxListCalls {
			p.Next = &Cursor{Token: page.Next}
			if len(p.Rows) < q.Limit {
				p.Note = fmt.Sprintf("This page read %d records of the store to find these; the next page goes on from there.", scanned)
			}
			return p, nil
		}
		lp.After = page.Next
	}
}

// maxListCalls bounds the store's List calls of one page (a Redis page
// may hold no record before the walk's end).
const maxListCalls = 100

// Find implements Source with Get (a scope given) or List's key filter;
// a store that keeps keys hashed needs the scope.
func (s *inspectorSource) Find(ctx context.Context, scope, key string, now time.Time) ([]Row, string, error) {
	if scope != "" {
		r, err := s.Get(ctx, Ref{Scope: scope, Key: key}, now)
		if errors.Is(err, idemstore.ErrNotFound) {
			return nil, "", nil
		}
		if err != nil {
			return nil, "", err
		}
		return []Row{r}, "", nil
	}
	if s.byID != nil {
		return nil, "", errBadQuery("this store keeps keys only hashed: give the scope too (idem serve names it 9:anonymous|POST /api/payments for anonymous clients)")
	}
	recs, err := s.listUpTo(ctx, idemstore.ListParams{Key: key, Now: now}, 100)
	if err != nil {
		return nil, "", fmt.Errorf("find: %w", err)
	}
	rows := make([]Row, len(recs))
	for i, r := range recs {
		rows[i] = s.row(r, nil)
	}
	return rows, "", nil
}

// Get implements Source.
func (s *inspectorSource) Get(ctx context.Context, r Ref, now time.Time) (Row, error) {
	var (
		ri  idemstore.RecordInfo
		err error
	)
	if r.named() {
		ri, err = s.in.Get(ctx, idemstore.GetParams{Scope: r.Scope, Key: r.Key, Now: now})
	} else if s.byID != nil {
		ri, err = s.byID.GetByID(ctx, r.StoreID)
	} else {
		return Row{}, idemstore.ErrNotFound
	}
	if err != nil {
		return Row{}, err
	}
	return Row{RecordInfo: ri, HasCheckpoint: len(ri.Checkpoint) > 0}, nil
}

// check re-reads the record and reports whether it is still what the
// operator confirmed.
func (s *inspectorSource) check(ctx context.Context, r Ref, fence int64, now time.Time, ok func(Row) bool) error {
	row, err := s.Get(ctx, r, now)
	if err != nil {
		return err
	}
	if !ok(row) || (fence != 0 && row.Fence != 0 && row.Fence != fence) {
		return ErrChanged
	}
	return nil
}

// Delete implements Source with the store's atomic Delete (which refuses
// an in-flight record).
func (s *inspectorSource) Delete(ctx context.Context, r Ref, fence int64, now time.Time) error {
	if err := s.check(ctx, r, fence, now, func(row Row) bool { return row.State == idemstore.StateCompleted }); err != nil {
		return err
	}
	var err error
	if r.named() {
		err = s.in.Delete(ctx, idemstore.DeleteParams{Scope: r.Scope, Key: r.Key, Now: now})
	} else {
		err = s.byID.DeleteByID(ctx, r.StoreID, false)
	}
	if errors.Is(err, idem.ErrInFlight) {
		return ErrChanged
	}
	return err
}

// Release implements Source with a forced Delete after checking that the
// lease ended: these stores offer no release by an operator in one step,
// so a take-over in the moment between the check and the delete would
// lose its record (its owner then gets ErrLeaseLost, as after idem delete
// --force).
func (s *inspectorSource) Release(ctx context.Context, r Ref, fence int64, now time.Time) error {
	if err := s.check(ctx, r, fence, now, func(row Row) bool { return row.leaseEnded(now) }); err != nil {
		return err
	}
	if r.named() {
		return s.in.Delete(ctx, idemstore.DeleteParams{Scope: r.Scope, Key: r.Key, Force: true, Now: now})
	}
	return s.byID.DeleteByID(ctx, r.StoreID, true)
}

// errBadQuery is a request the store cannot answer: the page answers 400.
type errBadQuery string

func (e errBadQuery) Error() string { return string(e) }
