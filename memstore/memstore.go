// Package memstore is an in-memory idemstore.Store for single-instance services
// and tests.
//
// Records live in the process: they do not survive a restart and are not
// shared between instances (use sqlitestore, pgstore or redisstore for
// that). Memory is bounded: the store holds at most Config.MaxRecords
// records, expired records count as absent at once, and DeleteExpired
// frees them. The store starts no goroutines.
package memstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/idemhq/idem/idemstore"
)

// DefaultMaxRecords is the default capacity of a Store.
const DefaultMaxRecords = 1 << 20

// Config configures a Store. A nil *Config means all defaults.
type Config struct {
	// MaxRecords bounds the records held at once; a claim for a new key
	// when the store is full returns idemstore.ErrStoreFull (the middleware
	// answers 503) after trying to evict expired records. Size it for peak
	// traffic times TTL. Defaults to DefaultMaxRecords (1,048,576).
	MaxRecords int
}

const shardCount = 64

// Store is an in-memory idemstore.Store. It also implements idemstore.Watcher, so
// that wait mode wakes up as soon as a record changes, and idemstore.StepStore
// (recovery points, not transactional). Fences come from one counter per
// Store, so they grow per key for the life of the process. The zero value
// is not usable; call New.
type Store struct {
	seed  maphash.Seed
	max   int64
	count atomic.Int64
	fence atomic.Int64
	// sweep is the shard where the last DeleteExpired stopped: the next
	// one resumes there instead of walking the shards it already swept
	// (and their live records) again.
	sweep  atomic.Uint32
	shards [shardCount]shard
}

type shard struct {
	mu      sync.Mutex
	records map[recordKey]record
	// watchers holds the watchers of this shard's in-flight records, by
	// record; wait mode alone adds to it. It lives beside the records
	// rather than in them: a field of every record is a word of every
	// map slot the collector scans.
	watchers map[recordKey]map[*watch]struct{}
	// arena holds the chunks completed records' data are carved from
	// (see carve), by lifetime class.
	arena [arenaClasses][]byte
}

type recordKey struct{ scope, key string }

// record is one stored record, held in its shard's map by value: a claim
// allocates no record of its own. A store may hold a million records, and
// the garbage collector scans every pointer in them on each cycle and
// marks every object they point to, so a record has few of both: times
// are Unix nanoseconds, and a completed record keeps its key, its
// fingerprint and its response (in idemstore.Response's binary encoding,
// pointer-free) back to back in one byte slice, data, which the map key's
// key is a view of (and the fingerprint, read through fp). Against a Response with
// a header map, its value slices and strings, that halved the heap the
// collector scans (92 to 42 MB with 150,000 completed records of the
// middleware's benchmark); against key, fingerprint and response as
// three objects, it marks one object per record instead of three. A
// replay decodes the response, in a few allocations.
// A record must stay within 128 bytes, beyond which the map would hold it
// through a pointer of its own.
type record struct {
	expiresAt int64
	leaseEnd  int64
	fence     int64
	// fingerprint is an in-flight record's; a completed record's is in
	// data (see fp), one pointer less for the collector to follow.
	fingerprint string
	token       string
	// data is, in flight, the checkpoint (nil without one); once
	// completed, key, fingerprint and encoded response, the response at
	// offset respAt (see complete).
	data      []byte
	respAt    uint32
	completed bool
}

// resp returns a completed record's encoded response.
func (r *record) resp() []byte {
	if !r.completed {
		return nil
	}
	return r.data[r.respAt:]
}

// fp returns the fingerprint of r, stored at k.
func (r *record) fp(k recordKey) string {
	if !r.completed || int(r.respAt) == len(k.key) {
		return r.fingerprint
	}
	return unsafe.String(&r.data[len(k.key)], int(r.respAt)-len(k.key))
}

// complete makes r, stored at k, a completed record with the encoded
// response enc, and returns the key to store it under: its key becomes a
// view of r.data, as its fingerprint does (fp). data is never written
// after, which is what makes the views (unsafe.String) safe. Storing the record under
// the returned key replaces the map's copy of the key (the map updates a
// string key on assignment), so that the claim's strings can be freed.
// data is carved out of one of the shard's chunks (see arena) when it is
// small enough.
func (r *record) complete(sh *shard, k recordKey, enc []byte, now int64) recordKey {
	kl, fl := len(k.key), len(r.fingerprint)
	data := sh.carve(kl+fl+len(enc), r.expiresAt-now)
	data = append(append(append(data, k.key...), r.fingerprint...), enc...)
	k.key = unsafe.String(unsafe.SliceData(data), kl)
	r.completed, r.data, r.respAt, r.token, r.fingerprint = true, data, uint32(kl+fl), "", ""
	return k
}

// Completed records' data share chunks of a few dozen kilobytes instead of
// being an object each: the garbage collector marks a chunk once, where
// it marked every record's object on every cycle (with 150,000 completed
// records, a collection took 14.4 ms before, 5.3–5.9 ms after). A chunk is only
// appended to: the bytes a record's data covers are never written again,
// and a chunk is freed when no record (and no view a caller keeps) points
// into it any more. Records of like remaining lifetimes share a chunk (one
// current chunk per class: remaining lifetimes within a factor of four),
// so that a chunk's records expire about together and a long-lived record
// does not keep short-lived ones' bytes. A shard's chunks start small and
// double up to arenaChunk as they fill, and DeleteExpired lets go of a
// shard's current chunks, so a class that is no longer used keeps none.
const (
	arenaChunk     = 64 << 10
	arenaFirst     = 1 << 10
	arenaMaxRecord = 4 << 10
	arenaClasses   = 32
)

// carve returns an empty slice with room for n bytes for a record that
// expires in ttl nanoseconds.
func (sh *shard) carve(n int, ttl int64) []byte {
	if n > arenaMaxRecord {
		return make([]byte, 0, n)
	}
	class := 0
	if ttl > 0 {
		class = min(bits.Len64(uint64(ttl))/2, arenaClasses-1)
	}
	c := &sh.arena[class]
	if cap(*c)-len(*c) < n {
		size := arenaFirst
		if *c != nil {
			size = min(2*cap(*c), arenaChunk)
		}
		*c = make([]byte, 0, max(size, n))
	}
	start := len(*c)
	*c = (*c)[:start+n]
	return (*c)[start : start : start+n]
}

type watch struct{ ch chan struct{} }

var (
	_ idemstore.Store     = (*Store)(nil)
	_ idemstore.Watcher   = (*Store)(nil)
	_ idemstore.StepStore = (*Store)(nil)
)

// New returns an empty Store.
func New(cfg *Config) (*Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MaxRecords == 0 {
		c.MaxRecords = DefaultMaxRecords
	}
	if c.MaxRecords < 0 {
		return nil, errors.New("memstore: MaxRecords is negative")
	}
	s := &Store{seed: maphash.MakeSeed(), max: int64(c.MaxRecords)}
	for i := range s.shards {
		s.shards[i].records = make(map[recordKey]record)
	}
	return s, nil
}

// shard returns the shard of k, chosen by its key alone with one
// maphash.String call: a shard only spreads the lock, and the records of
// one key in several scopes may share one (the map still tells them apart).
func (s *Store) shard(k recordKey) *shard {
	return &s.shards[maphash.String(s.seed, k.key)%shardCount]
}

// Len returns the number of records held, expired or not.
func (s *Store) Len() int { return int(s.count.Load()) }

// Claim implements idemstore.Store.
func (s *Store) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return idemstore.ClaimResult{}, err
	}
	if p.Lease <= 0 || p.TTL <= 0 {
		return idemstore.ClaimResult{}, fmt.Errorf("memstore: claim needs a positive lease and TTL")
	}
	k := recordKey{p.Scope, p.Key}
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()

	now := p.Now.UnixNano()
	r, ok := sh.records[k]
	if ok && now >= r.expiresAt {
		// Expired: it behaves as absent.
		sh.remove(s, k)
		ok = false
	}
	switch {
	case !ok:
		if s.count.Load() >= s.max {
			sh.evictExpired(s, now)
			if s.count.Load() >= s.max {
				return idemstore.ClaimResult{}, fmt.Errorf("memstore: %d records: %w", s.max, idemstore.ErrStoreFull)
			}
		}
		r = record{fingerprint: p.Fingerprint, expiresAt: p.Now.Add(p.TTL).UnixNano()}
		r.own(p, s.fence.Add(1))
		sh.records[k] = r
		s.count.Add(1)
		return idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: r.view(k)}, nil
	case r.fp(k) != p.Fingerprint:
		return idemstore.ClaimResult{Outcome: idemstore.ClaimMismatch, Record: r.view(k)}, nil
	case r.completed:
		return idemstore.ClaimResult{Outcome: idemstore.ClaimCompleted, Record: r.view(k)}, nil
	case now < r.leaseEnd:
		return idemstore.ClaimResult{Outcome: idemstore.ClaimInFlight, Record: r.view(k)}, nil
	default:
		r.own(p, s.fence.Add(1))
		sh.notify(k)
		sh.records[k] = r
		return idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, TookOver: true, Record: r.view(k)}, nil
	}
}

// own gives r to the claim p with a new lease. Its retention is the one
// set when it was created: a take-over never extends it.
func (r *record) own(p idemstore.ClaimParams, fence int64) {
	r.token, r.fence = p.Token, fence
	r.leaseEnd = p.Now.Add(p.Lease).UnixNano()
}

// view returns the record as the store's callers see it. A completed
// record's response is decoded anew each time: callers may keep it.
func (r *record) view(k recordKey) idemstore.Record {
	v := idemstore.Record{Fingerprint: r.fp(k), ExpiresAt: time.Unix(0, r.expiresAt).UTC(), State: idemstore.StateInFlight}
	if r.completed {
		v.State = idemstore.StateCompleted
		// The bytes are the store's own encoding: a failure is a bug,
		// and the caller then sees a completed record without a
		// response, which it reports as a store failure.
		if enc := r.resp(); len(enc) > 0 {
			if resp, err := idemstore.DecodeResponse(enc); err == nil {
				v.Response = resp
			}
		}
	} else {
		v.LeaseExpiresAt = time.Unix(0, r.leaseEnd).UTC()
		v.Fence, v.Checkpoint = r.fence, r.data
	}
	return v
}

// withOwned runs change on the in-flight record at (scope, key) if token
// owns it, under the shard's lock, and stores the changed record under the
// key change returns, or removes it, and wakes its watchers, as change
// says; otherwise it returns idemstore.ErrLeaseLost. This is the fencing
// rule every transition after a claim follows.
func (s *Store) withOwned(ctx context.Context, scope, key, token string, now time.Time, change func(*shard, recordKey, record) (recordKey, record, action)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	k := recordKey{scope, key}
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.records[k]
	if !ok || r.completed || r.token != token || now.UnixNano() >= r.expiresAt {
		return idemstore.ErrLeaseLost
	}
	// change gets and returns a copy: a pointer to r would move it to the
	// heap, the allocation the map's inline records save.
	k, r, act := change(sh, k, r)
	switch act {
	case removeRecord:
		sh.remove(s, k)
		return nil
	case storeAndNotify:
		sh.notify(k)
	}
	sh.records[k] = r
	return nil
}

// action is what withOwned does with a changed record.
type action int

const (
	storeRecord action = iota
	storeAndNotify
	removeRecord
)

// Renew implements idemstore.Store.
func (s *Store) Renew(ctx context.Context, p idemstore.RenewParams) error {
	return s.withOwned(ctx, p.Scope, p.Key, p.Token, p.Now, func(_ *shard, k recordKey, r record) (recordKey, record, action) {
		r.leaseEnd = p.Now.Add(p.Lease).UnixNano()
		return k, r, storeRecord
	})
}

// Complete implements idemstore.Store. The store keeps the response in its
// binary encoding (idemstore.Response.MarshalBinary), made outside the
// shard's lock; under it, the encoding is copied once more, beside the key
// and fingerprint (see record).
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if p.Response == nil {
		return errors.New("memstore: complete needs a response")
	}
	enc, err := p.Response.MarshalBinary()
	if err != nil {
		return fmt.Errorf("memstore: complete: %w", err)
	}
	return s.withOwned(ctx, p.Scope, p.Key, p.Token, p.Now, func(sh *shard, k recordKey, r record) (recordKey, record, action) {
		return r.complete(sh, k, enc, p.Now.UnixNano()), r, storeAndNotify
	})
}

// Release implements idemstore.Store.
func (s *Store) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	return s.withOwned(ctx, p.Scope, p.Key, p.Token, p.Now, func(_ *shard, k recordKey, r record) (recordKey, record, action) {
		return k, r, removeRecord
	})
}

// SaveCheckpoint implements idemstore.StepStore. The store keeps a copy of the
// checkpoint.
func (s *Store) SaveCheckpoint(ctx context.Context, p idemstore.SaveCheckpointParams) error {
	if len(p.Checkpoint) == 0 {
		return errors.New("memstore: empty checkpoint")
	}
	cp := bytes.Clone(p.Checkpoint)
	return s.withOwned(ctx, p.Scope, p.Key, p.Token, p.Now, func(_ *shard, k recordKey, r record) (recordKey, record, action) {
		r.data = cp
		switch {
		case p.Hold:
			r.leaseEnd = heldLeaseEnd
			return k, r, storeAndNotify
		case p.EndLease:
			r.leaseEnd = p.Now.UnixNano()
			return k, r, storeAndNotify
		}
		return k, r, storeRecord
	})
}

// heldLeaseEnd is the lease end of a record held for an operator
// (idemstore.SaveCheckpointParams.Hold): the Unix epoch.
const heldLeaseEnd = 0

// Stuck implements idemstore.StepStore. It walks every record: memstore is for
// single instances and tests, where that is cheap enough.
func (s *Store) Stuck(ctx context.Context, p idemstore.StuckParams) ([]idemstore.StuckRecord, error) {
	if p.Limit <= 0 {
		return nil, errors.New("memstore: Stuck needs a positive limit")
	}
	now := p.Now.UnixNano()
	var out []idemstore.StuckRecord
	err := s.walk(ctx, func(k recordKey, r record) {
		held := r.leaseEnd == heldLeaseEnd
		if !r.completed && r.data != nil && held == p.Held && r.leaseEnd <= now && now < r.expiresAt {
			out = append(out, idemstore.StuckRecord{Scope: k.scope, Key: k.key, Fingerprint: r.fingerprint,
				Checkpoint: r.data, LeaseExpiresAt: time.Unix(0, r.leaseEnd).UTC()})
		}
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b idemstore.StuckRecord) int { return a.LeaseExpiresAt.Compare(b.LeaseExpiresAt) })
	if len(out) > p.Limit {
		out = out[:p.Limit]
	}
	return out, nil
}

// DeleteExpired implements idemstore.Store.
func (s *Store) DeleteExpired(ctx context.Context, p idemstore.DeleteExpiredParams) (int, error) {
	if p.Limit <= 0 {
		return 0, errors.New("memstore: DeleteExpired needs a positive limit")
	}
	// Each call starts at the shard where the previous one stopped, and
	// visits every shard once.
	deleted, now := 0, p.Now.UnixNano()
	first := int(s.sweep.Load() % shardCount)
	for n := range shardCount {
		if err := ctx.Err(); err != nil {
			return deleted, err
		}
		i := (first + n) % shardCount
		sh := &s.shards[i]
		sh.mu.Lock()
		// The current chunks are let go of: a class this shard no longer
		// fills keeps no chunk past a sweep.
		sh.arena = [arenaClasses][]byte{}
		for k, r := range sh.records {
			if deleted == p.Limit {
				break
			}
			if now >= r.expiresAt {
				sh.remove(s, k)
				deleted++
			}
		}
		sh.mu.Unlock()
		if deleted == p.Limit {
			// This shard may hold more expired records: resume here.
			s.sweep.Store(uint32(i))
			break
		}
	}
	return deleted, nil
}

// evictExpired frees the expired records of one shard (the caller holds
// its lock) to make room for a claim in a full store.
func (sh *shard) evictExpired(s *Store, now int64) {
	for k, r := range sh.records {
		if now >= r.expiresAt {
			sh.remove(s, k)
		}
	}
}

func (sh *shard) remove(s *Store, k recordKey) {
	delete(sh.records, k)
	s.count.Add(-1)
	sh.notify(k)
}

// Watch implements idemstore.Watcher: the channel is closed when the record
// completes, is released, expires or is taken over, or at once if it is not
// in flight. The registration ends with ctx.
func (s *Store) Watch(ctx context.Context, scope, key string) (<-chan struct{}, error) {
	k := recordKey{scope, key}
	sh := s.shard(k)
	w := &watch{ch: make(chan struct{})}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	r, ok := sh.records[k]
	if !ok || r.completed {
		close(w.ch)
		return w.ch, nil
	}
	watchers := sh.watchers[k]
	if watchers == nil {
		if sh.watchers == nil {
			sh.watchers = make(map[recordKey]map[*watch]struct{})
		}
		watchers = make(map[*watch]struct{})
		sh.watchers[k] = watchers
	}
	context.AfterFunc(ctx, func() {
		sh.mu.Lock()
		delete(watchers, w) // a no-op once notify has run
		sh.mu.Unlock()
	})
	watchers[w] = struct{}{}
	return w.ch, nil
}

// notify wakes every watcher of the record at k; the caller holds the
// shard's lock.
func (sh *shard) notify(k recordKey) {
	if len(sh.watchers) == 0 {
		return
	}
	for w := range sh.watchers[k] {
		close(w.ch)
	}
	delete(sh.watchers, k)
}

// walk calls fn on every record, holding one shard's lock at a time, and
// stops with ctx's error between shards.
func (s *Store) walk(ctx context.Context, fn func(recordKey, record)) error {
	for i := range s.shards {
		if err := ctx.Err(); err != nil {
			return err
		}
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, r := range sh.records {
			fn(k, r)
		}
		sh.mu.Unlock()
	}
	return nil
}
