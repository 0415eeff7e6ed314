package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/redis/go-redis/v9"
)

// Defaults of Config.
const (
	// DefaultPrefix starts every key the store writes.
	DefaultPrefix = "idem:"
	// DefaultMaxResponseBytes is the default bound on a stored response
	// body: the middleware's default MaxResponseBody, so that every body
	// the middleware records is also stored.
	DefaultMaxResponseBytes = 1 << 20
	// DefaultMaxHeaderBytes is the default bound on the encoded status and
	// header fields of a stored response.
	DefaultMaxHeaderBytes = 64 << 10
)

// Config configures a Store. A nil *Config means all defaults, and so does
// each zero field.
type Config struct {
	// Prefix starts the name of every key the store writes, so that several
	// stores (or other applications) can share one Redis database. It must
	// not contain '{' or '}': Redis Cluster places a key by the first
	// {...} in its name, and the store's own hash tag must be that one.
	// Defaults to DefaultPrefix ("idem:").
	Prefix string

	// MaxResponseBytes bounds the body of a response Complete stores; a
	// larger one makes Complete return idemstore.ErrResponseTooLarge without
	// changing the record, and the core then completes the record without
	// a body (a retry gets 409 idempotency.response_unavailable, never a
	// second execution). Bodies are never dropped silently. Defaults to
	// DefaultMaxResponseBytes (1 MiB).
	MaxResponseBytes int

	// MaxHeaderBytes bounds the encoded status and header fields of a
	// response Complete stores, with the same effect as MaxResponseBytes
	// when exceeded. Defaults to DefaultMaxHeaderBytes (64 KiB).
	MaxHeaderBytes int

	// WaitReplicas, when positive, makes every write (Claim, Renew,
	// Complete, Release) wait until at least this many replicas of the
	// record's master acknowledged it (Redis WAIT), and fail with
	// ErrNotReplicated (the middleware answers 503) when they do not
	// within WaitTimeout. Redis replicates asynchronously: without it a
	// failover can forget a claim or a completion the master confirmed a
	// moment earlier, and the retry executes again (docs/operations.md
	// measures it). It costs one more round trip and the replication delay
	// on every write. The client must be a *redis.Client (also from
	// redis.NewFailoverClient) or a *redis.ClusterClient. Defaults to 0:
	// no waiting.
	WaitReplicas int

	// WaitTimeout bounds each wait for WaitReplicas. Defaults to
	// DefaultWaitTimeout (100 ms).
	WaitTimeout time.Duration
}

// Store is an idemstore.Store that keeps records in Redis (or a compatible
// server such as Valkey), shared by every process using the same Redis
// and Prefix. It decides leases and retention with the Redis server's
// clock and ignores the Now in its parameters. It is safe for concurrent
// use. The zero value is not usable; call New.
type Store struct {
	client     redis.UniversalClient
	prefix     string
	maxBody    int
	maxHeaders int

	waitReplicas int
	waitTimeout  time.Duration
}

var _ idemstore.Store = (*Store)(nil)

// New returns a Store on client. The caller owns client (and closes it);
// New performs no I/O and starts no goroutines. The Lua scripts are loaded
// into Redis on their first use and again whenever Redis reports it no
// longer has them (after a restart, a failover or SCRIPT FLUSH).
func New(client redis.UniversalClient, cfg *Config) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: nil client")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(c.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: Prefix %q contains '{' or '}', which would override the record's Redis Cluster hash tag", c.Prefix)
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.MaxResponseBytes < 0 {
		return nil, errors.New("redisstore: MaxResponseBytes is negative")
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.MaxHeaderBytes < 0 {
		return nil, errors.New("redisstore: MaxHeaderBytes is negative")
	}
	if err := waitConfig(client, &c); err != nil {
		return nil, err
	}
	return &Store{client: client, prefix: c.Prefix, maxBody: c.MaxResponseBytes, maxHeaders: c.MaxHeaderBytes,
		waitReplicas: c.WaitReplicas, waitTimeout: c.WaitTimeout}, nil
}

// Key returns the name of the Redis key that holds the record for (scope,
// key): the prefix and, in braces, the hex SHA-256 of scope and key. The
// braces make the digest the key's Redis Cluster hash tag, whatever bytes
// the scope or key contain, and neither appears in clear in Redis.
func (s *Store) Key(scope, key string) string {
	// The length prefix keeps (scope "a", key "bc") apart from ("ab", "c").
	var buf [512]byte
	in := binary.AppendUvarint(buf[:0], uint64(len(scope)))
	in = append(append(in, scope...), key...)
	sum := sha256.Sum256(in)
	var tag [2 * sha256.Size]byte
	hex.Encode(tag[:], sum[:])
	var b strings.Builder
	b.Grow(len(s.prefix) + len(tag) + 2)
	b.WriteString(s.prefix)
	b.WriteByte('{')
	b.Write(tag[:])
	b.WriteByte('}')
	return b.String()
}

// Claim implements idemstore.Store. Lease and TTL count from the Redis server's
// clock; p.Now is ignored.
func (s *Store) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return idemstore.ClaimResult{}, fmt.Errorf("redisstore: claim: %w", err)
	}
	lease, ttl := p.Lease.Milliseconds(), p.TTL.Milliseconds()
	if lease <= 0 || ttl <= 0 {
		return idemstore.ClaimResult{}, fmt.Errorf("redisstore: claim needs a lease and TTL of at least a millisecond, got %v and %v", p.Lease, p.TTL)
	}
	c := newCall(s.Key(p.Scope, p.Key)).str(p.Fingerprint).str(p.Token).num(lease).num(ttl)
	v, err := s.run(ctx, claimScript, c).Result()
	if err != nil {
		return idemstore.ClaimResult{}, fmt.Errorf("redisstore: claim: %w", err)
	}
	switch v := v.(type) {
	case int64: // a new key: v is its fence
		return acquiredNew(v, p.Fingerprint, lease, ttl), nil
	case []any:
		r, err := parseClaim(v, p.Fingerprint)
		if err != nil {
			return idemstore.ClaimResult{}, fmt.Errorf("redisstore: claim: %w", err)
		}
		return r, nil
	}
	return idemstore.ClaimResult{}, fmt.Errorf("redisstore: claim: unexpected script reply %v", v)
}

// acquiredNew is the ClaimResult of a claim of a new key, whose script
// replied its fence only: the Redis clock in microseconds, from which the
// lease end and expiry follow with the claim's leaseMs and ttlMs (see
// lua/claim.lua).
func acquiredNew(fence int64, fp string, leaseMs, ttlMs int64) idemstore.ClaimResult {
	now := fence / 1000
	var r idemstore.ClaimResult
	r.Outcome, r.Record.State, r.Record.Fingerprint, r.Record.Fence = idemstore.ClaimAcquired, idemstore.StateInFlight, fp, fence
	r.Record.LeaseExpiresAt = time.UnixMilli(now + leaseMs).UTC()
	r.Record.ExpiresAt = time.UnixMilli(now + ttlMs).UTC()
	return r
}

// parseClaim turns claimScript's array reply (every outcome but a new
// key's) into a ClaimResult. fp is the claim's fingerprint: the reply
// repeats it only for a mismatch.
func parseClaim(v []any, fp string) (idemstore.ClaimResult, error) {
	num := func(i int) (int64, bool) {
		if i >= len(v) {
			return 0, false
		}
		n, ok := v[i].(int64)
		return n, ok
	}
	outcome, ok := num(0)
	if !ok {
		return idemstore.ClaimResult{}, fmt.Errorf("unexpected script reply %v", v)
	}
	var r idemstore.ClaimResult
	r.Record.State, r.Record.Fingerprint = idemstore.StateInFlight, fp
	var lease, exp int64
	switch outcome {
	case claimAcquired: // {1, took over, lease end, expires at, fence}
		took, ok1 := num(1)
		l, ok2 := num(2)
		e, ok3 := num(3)
		fence, ok4 := num(4)
		if !ok1 || !ok2 || !ok3 || !ok4 {
			return idemstore.ClaimResult{}, fmt.Errorf("unexpected acquired reply %v", v)
		}
		r.Outcome, r.TookOver, r.Record.Fence = idemstore.ClaimAcquired, took == 1, fence
		lease, exp = l, e
	case claimInFlight: // {3, lease end, expires at}
		l, ok1 := num(1)
		e, ok2 := num(2)
		if !ok1 || !ok2 {
			return idemstore.ClaimResult{}, fmt.Errorf("unexpected in-flight reply %v", v)
		}
		r.Outcome = idemstore.ClaimInFlight
		lease, exp = l, e
	case claimMismatch: // {4, lease end or 0, expires at, fingerprint}
		l, ok1 := num(1)
		e, ok2 := num(2)
		var stored string
		if len(v) > 3 {
			stored, ok = v[3].(string)
		}
		if !ok1 || !ok2 || !ok {
			return idemstore.ClaimResult{}, fmt.Errorf("unexpected mismatch reply %v", v)
		}
		r.Outcome, r.Record.Fingerprint = idemstore.ClaimMismatch, stored
		lease, exp = l, e
		if lease == 0 {
			r.Record.State = idemstore.StateCompleted
		}
	case claimCompleted: // {2, expires at, encoded response}
		e, ok1 := num(1)
		var enc string
		if len(v) > 2 {
			enc, ok = v[2].(string)
		}
		if !ok1 || !ok {
			return idemstore.ClaimResult{}, errors.New("completed record without a response")
		}
		resp := new(idemstore.Response)
		if err := resp.UnmarshalBinary([]byte(enc)); err != nil {
			return idemstore.ClaimResult{}, fmt.Errorf("stored response: %w", err)
		}
		r.Outcome, r.Record.State, r.Record.Response = idemstore.ClaimCompleted, idemstore.StateCompleted, resp
		exp = e
	default:
		return idemstore.ClaimResult{}, fmt.Errorf("unknown claim outcome %d", outcome)
	}
	r.Record.ExpiresAt = time.UnixMilli(exp).UTC()
	if r.Record.State == idemstore.StateInFlight {
		r.Record.LeaseExpiresAt = time.UnixMilli(lease).UTC()
	}
	return r, nil
}

// Renew implements idemstore.Store. The lease counts from the Redis server's
// clock; p.Now is ignored. A renewal never moves the lease's end earlier
// (with a shorter Lease, or after the Redis clock went back): fences rely
// on it (see lua/claim.lua).
func (s *Store) Renew(ctx context.Context, p idemstore.RenewParams) error {
	lease := p.Lease.Milliseconds()
	if lease <= 0 {
		return fmt.Errorf("redisstore: renew needs a lease of at least a millisecond, got %v", p.Lease)
	}
	return s.owned(ctx, "renew", renewScript, newCall(s.Key(p.Scope, p.Key)).str(p.Token).num(lease))
}

// Complete implements idemstore.Store. The record keeps the retention its claim
// gave it. A response whose body is larger than Config.MaxResponseBytes,
// or whose status and header fields encode to more than
// Config.MaxHeaderBytes, is refused with idemstore.ErrResponseTooLarge before
// Redis is asked anything.
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if p.Response == nil {
		return errors.New("redisstore: complete needs a response")
	}
	body, size := len(p.Response.Body), p.Response.EncodedSize()
	if body > s.maxBody {
		return fmt.Errorf("redisstore: complete: body of %d bytes, limit %d: %w", body, s.maxBody, idemstore.ErrResponseTooLarge)
	}
	if h := size - body; h > s.maxHeaders {
		return fmt.Errorf("redisstore: complete: status and header fields of %d bytes, limit %d: %w", h, s.maxHeaders, idemstore.ErrResponseTooLarge)
	}
	// The MarshalBinary encoding, into a buffer of its exact size.
	enc, err := p.Response.AppendBinary(make([]byte, 0, size))
	if err != nil {
		return fmt.Errorf("redisstore: complete: %w", err)
	}
	return s.owned(ctx, "complete", completeScript, newCall(s.Key(p.Scope, p.Key)).str(p.Token).bytes(enc))
}

// Release implements idemstore.Store.
func (s *Store) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	return s.owned(ctx, "release", releaseScript, newCall(s.Key(p.Scope, p.Key)).str(p.Token))
}

// owned runs a script that acts only for the owner token (the first
// argument after the key in c) and replies 1 if it did, 0 if the token
// does not own the record.
func (s *Store) owned(ctx context.Context, op string, script *script, c *call) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("redisstore: %s: %w", op, err)
	}
	n, err := s.run(ctx, script, c).Int64()
	if err != nil {
		return fmt.Errorf("redisstore: %s: %w", op, err)
	}
	if n != 1 {
		return fmt.Errorf("redisstore: %s: %w", op, idemstore.ErrLeaseLost)
	}
	return nil
}

// DeleteExpired implements idemstore.Store. Every record's key carries a Redis
// expiry at the end of its retention, so Redis deletes expired records by
// itself and there is nothing left to delete: DeleteExpired checks its
// arguments, talks to nobody and returns 0. Callers that run it for every
// store may keep doing so.
func (s *Store) DeleteExpired(ctx context.Context, p idemstore.DeleteExpiredParams) (int, error) {
	if p.Limit <= 0 {
		return 0, fmt.Errorf("redisstore: DeleteExpired needs a positive limit, got %d", p.Limit)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("redisstore: delete expired: %w", err)
	}
	return 0, nil
}
