package memstore

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idemhq/idem/idemstore"
)

var _ idemstore.Inspector = (*Store)(nil)

func (s *Store) info(k recordKey, r *record, withResponse bool) idemstore.RecordInfo {
	v := *r
	switch {
	case withResponse:
	case v.completed:
		v.data = v.data[:v.respAt] // the response is not decoded for a listing
	default:
		v.data = nil // nor the checkpoint copied
	}
	ri := idemstore.RecordInfo{Scope: k.scope, Key: k.key, Record: v.view(k)}
	if r.completed {
		ri.ResponseSize = len(r.resp())
	}
	return ri
}

// errNoID answers a GetParams.ID or DeleteParams.ID: memstore names
// records by scope and key only.
var errNoID = fmt.Errorf("memstore: %w: records are named by scope and key", idemstore.ErrInvalidID)

// Get implements idemstore.Inspector.
func (s *Store) Get(ctx context.Context, p idemstore.GetParams) (idemstore.RecordInfo, error) {
	if err := ctx.Err(); err != nil {
		return idemstore.RecordInfo{}, err
	}
	if p.ID != "" {
		return idemstore.RecordInfo{}, errNoID
	}
	k := recordKey{p.Scope, p.Key}
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.records[k]
	if !ok || p.Now.UnixNano() >= r.expiresAt {
		return idemstore.RecordInfo{}, idemstore.ErrNotFound
	}
	return s.info(k, &r, true), nil
}

// List implements idemstore.Inspector; records come in (Scope, Key) byte order.
// Each page visits every record, holding one shard's lock at a time, and
// keeps only the Limit+1 smallest that follow After (a heap), so a page
// costs O(n log Limit) time and O(Limit) memory for n records.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	if p.Limit <= 0 {
		return idemstore.ListPage{}, errors.New("memstore: list: the limit must be positive")
	}
	var after *recordKey
	if p.After != "" {
		scope, key, err := idemstore.ParseListCursor(p.After)
		if err != nil {
			return idemstore.ListPage{}, fmt.Errorf("memstore: list: %w", err)
		}
		after = &recordKey{scope, key}
	}
	now := p.Now.UnixNano()
	// best holds the smallest records seen, up to Limit+1 (one more tells
	// whether another page follows), as a max-heap on (scope, key).
	best := &keyHeap{}
	err := s.walk(ctx, func(k recordKey, r record) {
		if now >= r.expiresAt || (p.Key != "" && k.key != p.Key) ||
			(p.State != 0 && r.completed != (p.State == idemstore.StateCompleted)) ||
			(after != nil && compareKeys(k, *after) <= 0) {
			return
		}
		if best.Len() <= p.Limit {
			heap.Push(best, entry{k, s.info(k, &r, false)})
		} else if compareKeys(k, best.entries[0].k) < 0 {
			best.entries[0] = entry{k, s.info(k, &r, false)}
			heap.Fix(best, 0)
		}
	})
	if err != nil {
		return idemstore.ListPage{}, fmt.Errorf("memstore: list: %w", err)
	}
	entries := best.entries
	slices.SortFunc(entries, func(a, b entry) int { return compareKeys(a.k, b.k) })
	var page idemstore.ListPage
	if len(entries) > p.Limit {
		entries = entries[:p.Limit]
		last := entries[len(entries)-1].k
		page.Next = idemstore.ListCursor(last.scope, last.key)
	}
	page.Records = make([]idemstore.RecordInfo, len(entries))
	for i, e := range entries {
		page.Records[i] = e.info
	}
	return page, nil
}

func compareKeys(a, b recordKey) int {
	return cmp.Or(strings.Compare(a.scope, b.scope), strings.Compare(a.key, b.key))
}

type entry struct {
	k    recordKey
	info idemstore.RecordInfo
}

// keyHeap is a max-heap of entries on (scope, key): its root is the
// largest, the one a smaller record replaces.
type keyHeap struct{ entries []entry }

func (h *keyHeap) Len() int           { return len(h.entries) }
func (h *keyHeap) Less(i, j int) bool { return compareKeys(h.entries[i].k, h.entries[j].k) > 0 }
func (h *keyHeap) Swap(i, j int)      { h.entries[i], h.entries[j] = h.entries[j], h.entries[i] }
func (h *keyHeap) Push(x any)         { h.entries = append(h.entries, x.(entry)) }
func (h *keyHeap) Pop() any {
	e := h.entries[len(h.entries)-1]
	h.entries = h.entries[:len(h.entries)-1]
	return e
}

// Delete implements idemstore.Inspector. Watchers of the record wake up.
func (s *Store) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.ID != "" {
		return errNoID
	}
	k := recordKey{p.Scope, p.Key}
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.records[k]
	switch {
	case !ok || p.Now.UnixNano() >= r.expiresAt:
		return idemstore.ErrNotFound
	case !r.completed && !p.Force:
		return idemstore.ErrInFlight
	}
	sh.remove(s, k)
	return nil
}
