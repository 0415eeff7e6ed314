package memstore

import (
	"cmp"
	"context"
	"errors"
	"slices"

	"github.com/idemhq/idem"
)

var _ idem.Inspector = (*Store)(nil)

func (s *Store) info(k recordKey, r *record, withResponse bool) idem.RecordInfo {
	ri := idem.RecordInfo{Scope: k.scope, Key: k.key, Record: r.view()}
	if r.completed && r.resp != nil {
		ri.ResponseSize = r.resp.EncodedSize()
	}
	if !withResponse {
		ri.Response, ri.Checkpoint = nil, nil
	}
	return ri
}

// Get implements idem.Inspector.
func (s *Store) Get(ctx context.Context, p idem.GetParams) (idem.RecordInfo, error) {
	if err := ctx.Err(); err != nil {
		return idem.RecordInfo{}, err
	}
	k := recordKey{p.Scope, p.Key}
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.records[k]
	if !ok || p.Now.UnixNano() >= r.expiresAt {
		return idem.RecordInfo{}, idem.ErrNotFound
	}
	return s.info(k, r, true), nil
}

// List implements idem.Inspector; records come sorted by (Scope, Key). It
// visits every record, holding one shard's lock at a time.
func (s *Store) List(ctx context.Context, p idem.ListParams) ([]idem.RecordInfo, error) {
	if p.Limit <= 0 {
		return nil, errors.New("memstore: List needs a positive limit")
	}
	now := p.Now.UnixNano()
	var out []idem.RecordInfo
	err := s.walk(ctx, func(k recordKey, r *record) {
		if now >= r.expiresAt || (p.Key != "" && k.key != p.Key) ||
			(p.State != 0 && r.completed != (p.State == idem.StateCompleted)) {
			return
		}
		out = append(out, s.info(k, r, false))
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b idem.RecordInfo) int {
		return cmp.Or(cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Key, b.Key))
	})
	return out[:min(len(out), p.Limit)], nil
}

// Delete implements idem.Inspector. Watchers of the record wake up.
func (s *Store) Delete(ctx context.Context, p idem.DeleteParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k := recordKey{p.Scope, p.Key}
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.records[k]
	switch {
	case !ok || p.Now.UnixNano() >= r.expiresAt:
		return idem.ErrNotFound
	case !r.completed && !p.Force:
		return idem.ErrInFlight
	}
	sh.remove(s, k, r)
	return nil
}
