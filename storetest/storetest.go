// Package storetest is the conformance suite every idemstore.Store must pass.
//
// A store's own tests call Run once:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Harness{
//			NewStore: func(t *testing.T) idemstore.Store { return newIsolatedStore(t) },
//		})
//	}
//
// Every subtest runs in parallel on a fresh store from NewStore, which must
// isolate it from every other (a t.TempDir database, a schema or a key
// prefix per call; never a flush of shared state). The suite checks each
// rule of the idemstore.Store contract, the optional capabilities the store
// implements (idemstore.TxStore, idemstore.TxClaimer, idemstore.Watcher, idemstore.StepStore), the fencing
// token, and that every sentinel error is returned where the contract names
// it, with errors.Is.
//
// With Harness.Encryption set, the suite runs as the core runs with
// idem.Config.Encryption (sealed responses, hashed names). RunAtRest checks
// encryption at rest through the middleware, reading the store's contents
// with the database's own client (see Raw).
//
// It uses only the standard library's testing package.
package storetest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
)

// Harness tells the suite how to get a store.
type Harness struct {
	// NewStore returns a fresh, empty store, isolated from every other
	// store the suite creates. It is called once per subtest, from
	// parallel subtests, and should register its own cleanup with t.
	NewStore func(t *testing.T) idemstore.Store

	// ServerClock declares that the store decides time with its server's
	// clock and ignores the Now in its parameters (pgstore, redisstore).
	// The suite then lets leases and retention pass in real time, with
	// short durations, and checks that a skewed Now changes nothing.
	ServerClock bool

	// SelfExpiring declares that the backend deletes records itself when
	// their retention ends (Redis key expiry), so that DeleteExpired finds
	// none left to delete. The suite then checks that expired records are
	// gone and unexpired ones remain, without counting deletions.
	SelfExpiring bool

	// Encryption, when set, runs the suite as the core runs with
	// Config.Encryption: every response the suite completes is sealed
	// first (Store.Complete and idemstore.Tx.Complete), every response a claim
	// returns is opened before it is compared, and the suite's names pass
	// through Encryption.StoredKey. The store itself is used as it is, so
	// every optional capability is still checked.
	Encryption *idemcrypt.Encryption

	// HashedKeys declares that the store keeps scopes and keys only
	// hashed (redisstore), so that idemstore.Inspector's List cannot return or
	// filter by them. The suite then checks List without them.
	HashedKeys bool

	// DeferredTakeOver declares that the store may answer ClaimInFlight
	// instead of taking over an expired lease when it cannot do so
	// promptly, as the Store contract allows (sqlitestore bounds its wait
	// for the write lock at 100 ms). Where the suite expects a take-over it
	// then claims again, for up to 10 seconds, as a client retries a 409.
	DeferredTakeOver bool

	// ScanOrder declares that idemstore.Inspector's List walks its backend's
	// own scan (redisstore: SCAN) rather than (Scope, Key) order: a walk
	// lists every record that lives through it at least once, and may list
	// one twice. The suite then checks at least once where it checks
	// exactly once for the others.
	ScanOrder bool
}

// Run runs the conformance suite.
func Run(t *testing.T, h Harness) {
	if h.NewStore == nil {
		t.Fatal("storetest: Harness.NewStore is nil")
	}
	t.Run("Claim", func(t *testing.T) { t.Parallel(); testClaim(t, h) })
	t.Run("Fencing", func(t *testing.T) { t.Parallel(); testFencing(t, h) })
	t.Run("Lease", func(t *testing.T) { t.Parallel(); testLease(t, h) })
	t.Run("Expiry", func(t *testing.T) { t.Parallel(); testExpiry(t, h) })
	t.Run("Concurrency", func(t *testing.T) { t.Parallel(); testConcurrency(t, h) })
	t.Run("Response", func(t *testing.T) { t.Parallel(); testResponse(t, h) })
	t.Run("Tx", func(t *testing.T) { t.Parallel(); testTx(t, h) })
	t.Run("ClaimTx", func(t *testing.T) { t.Parallel(); testClaimTx(t, h) })
	t.Run("Watch", func(t *testing.T) { t.Parallel(); testWatch(t, h) })
	t.Run("Fence", func(t *testing.T) { t.Parallel(); testFence(t, h) })
	t.Run("Steps", func(t *testing.T) { t.Parallel(); testSteps(t, h) })
	t.Run("Inspect", func(t *testing.T) { t.Parallel(); testInspect(t, h) })
}

// bundle is what one subtest works with.
type bundle struct {
	t     *testing.T
	h     Harness
	store idemstore.Store
	clock *clock
	lease time.Duration
	ttl   time.Duration
	ctx   context.Context
	seq   atomic.Int64
}

// setup marks the subtest parallel and gives it a fresh store.
func setup(t *testing.T, h Harness) *bundle {
	t.Helper()
	t.Parallel()
	b := &bundle{t: t, h: h, store: h.NewStore(t), ctx: t.Context()}
	if h.ServerClock {
		// Long enough that a check made right after a claim lands well
		// inside the lease on a loaded machine; short enough to wait out.
		b.lease, b.ttl = 1500*time.Millisecond, 4*time.Second
		b.clock = &clock{server: true}
	} else {
		b.lease, b.ttl = 30*time.Second, 24*time.Hour
		b.clock = &clock{base: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)}
	}
	return b
}

// clock is the suite's view of time. For stores that take Now from their
// parameters it is a fake that Advance moves instantly; for server-clock
// stores it is the real clock and Advance waits, because the only way to
// let a server's lease pass is to let real time pass.
type clock struct {
	server bool
	base   time.Time
	offset atomic.Int64
}

func (c *clock) Now() time.Time {
	if c.server {
		return time.Now()
	}
	return c.base.Add(time.Duration(c.offset.Load()))
}

func (c *clock) Advance(d time.Duration) {
	if !c.server {
		c.offset.Add(int64(d))
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
}

// names returns a fresh (scope, key) pair.
func (b *bundle) names() (string, string) {
	n := b.seq.Add(1)
	return b.h.Encryption.StoredKey(idem.Scope("tenant", "POST /things"), fmt.Sprintf("key-%d", n))
}

// seal returns resp as the core would hand it to the store for p's record.
func (b *bundle) seal(p idemstore.ClaimParams, resp *idemstore.Response) *idemstore.Response {
	b.t.Helper()
	if resp == nil {
		return nil
	}
	sealed, err := b.h.Encryption.Seal(b.ctx, p.Scope, p.Key, resp)
	if err != nil {
		b.t.Fatalf("Seal: %v", err)
	}
	return sealed
}

// open returns the response r's record holds as the core would read it.
func (b *bundle) open(p idemstore.ClaimParams, r idemstore.ClaimResult) idemstore.ClaimResult {
	if r.Record.Response == nil || b.h.Encryption == nil {
		return r
	}
	resp, err := b.h.Encryption.Open(b.ctx, p.Scope, p.Key, r.Record.Response)
	if err != nil {
		b.t.Errorf("Open(%q): %v", p.Key, err)
		return r
	}
	r.Record.Response = resp
	return r
}

func (b *bundle) token() string {
	return fmt.Sprintf("token-%d-%d", b.seq.Add(1), time.Now().UnixNano())
}

func (b *bundle) claimParams(scope, key, fp string) idemstore.ClaimParams {
	return idemstore.ClaimParams{Scope: scope, Key: key, Fingerprint: fp, Token: b.token(),
		Lease: b.lease, TTL: b.ttl, Now: b.clock.Now()}
}

func (b *bundle) claim(p idemstore.ClaimParams) idemstore.ClaimResult {
	b.t.Helper()
	p.Now = b.clock.Now()
	r, err := b.store.Claim(b.ctx, p)
	if err != nil {
		b.t.Fatalf("Claim(%q): %v", p.Key, err)
	}
	return b.open(p, r)
}

func (b *bundle) mustOutcome(p idemstore.ClaimParams, want idemstore.ClaimOutcome) idemstore.ClaimResult {
	b.t.Helper()
	r := b.claim(p)
	if r.Outcome != want {
		b.t.Fatalf("Claim(%q) = %v, want %v", p.Key, r.Outcome, want)
	}
	return r
}

// takeOver claims p over a record whose lease has expired and expects
// ClaimAcquired; a store with Harness.DeferredTakeOver may first answer
// ClaimInFlight, and is asked again.
func (b *bundle) takeOver(p idemstore.ClaimParams) idemstore.ClaimResult {
	b.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := b.claim(p)
		if r.Outcome == idemstore.ClaimInFlight && b.h.DeferredTakeOver && time.Now().Before(deadline) {
			continue
		}
		if r.Outcome != idemstore.ClaimAcquired {
			b.t.Fatalf("take-over Claim(%q) = %v, want %v", p.Key, r.Outcome, idemstore.ClaimAcquired)
		}
		return r
	}
}

// acquire claims a new record and returns the params that own it.
func (b *bundle) acquire(fp string) idemstore.ClaimParams {
	b.t.Helper()
	scope, key := b.names()
	p := b.claimParams(scope, key, fp)
	b.mustOutcome(p, idemstore.ClaimAcquired)
	return p
}

func (b *bundle) complete(p idemstore.ClaimParams, resp *idemstore.Response) error {
	return b.store.Complete(b.ctx, idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token,
		Response: b.seal(p, resp), Now: b.clock.Now()})
}

// describe says what the store holds at p's key, for a failure message:
// the record's state and times as an Inspector reads them, and the time
// of asking.
func (b *bundle) describe(p idemstore.ClaimParams) string {
	in, ok := b.store.(idemstore.Inspector)
	if !ok {
		return "the store cannot be inspected"
	}
	now := time.Now()
	// Bounded: a store that stalled is why some commits fail.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.ctx), 5*time.Second)
	defer cancel()
	ri, err := in.Get(ctx, idemstore.GetParams{Scope: p.Scope, Key: p.Key, Now: b.clock.Now()})
	if err != nil {
		return fmt.Sprintf("Get at %s: %v", now.Format(time.RFC3339Nano), err)
	}
	return fmt.Sprintf("at %s the record is %v, fingerprint %s, lease until %s, expires %s, fence %d",
		now.Format(time.RFC3339Nano), ri.State, ri.Fingerprint, ri.LeaseExpiresAt.Format(time.RFC3339Nano),
		ri.ExpiresAt.Format(time.RFC3339Nano), ri.Fence)
}

func (b *bundle) release(p idemstore.ClaimParams) error {
	return b.store.Release(b.ctx, idemstore.ReleaseParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Now: b.clock.Now()})
}

func (b *bundle) renew(p idemstore.ClaimParams) error {
	return b.store.Renew(b.ctx, idemstore.RenewParams{Scope: p.Scope, Key: p.Key, Token: p.Token,
		Lease: b.lease, Now: b.clock.Now()})
}

// other returns p with a fresh owner token: a second attempt at the same
// request.
func (b *bundle) other(p idemstore.ClaimParams) idemstore.ClaimParams {
	p.Token = b.token()
	return p
}

const (
	fpA = idem.FingerprintVersion + ":aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	fpB = idem.FingerprintVersion + ":bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func sampleResponse() *idemstore.Response {
	return &idemstore.Response{
		StatusCode: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/things/1"},
			"X-Multi":      {"one", "two"},
		},
		Body: []byte(`{"id":"1","amount":100}`),
	}
}

// sameResponse reports how got differs from want, or "" if they are equal.
// A nil and an empty header or body are equal.
func sameResponse(got, want *idemstore.Response) string {
	switch {
	case got == nil:
		return "no response"
	case got.StatusCode != want.StatusCode:
		return fmt.Sprintf("status %d, want %d", got.StatusCode, want.StatusCode)
	case got.Unreplayable != want.Unreplayable:
		return fmt.Sprintf("unreplayable %v, want %v", got.Unreplayable, want.Unreplayable)
	case !bytes.Equal(got.Body, want.Body):
		return fmt.Sprintf("body of %d bytes differs from the %d bytes stored", len(got.Body), len(want.Body))
	case len(got.Header) != len(want.Header):
		return fmt.Sprintf("header %v, want %v", got.Header, want.Header)
	}
	for k, vs := range want.Header {
		if !slices.Equal(got.Header[k], vs) {
			return fmt.Sprintf("header %s = %q, want %q", k, got.Header[k], vs)
		}
	}
	return ""
}

// near checks a time the store computed against the expected value: exactly
// for the fake clock, within a tolerance for a server clock.
func (b *bundle) near(what string, got, want time.Time) {
	b.t.Helper()
	if !b.h.ServerClock {
		if !got.Equal(want) {
			b.t.Errorf("%s = %v, want %v", what, got, want)
		}
		return
	}
	if d := got.Sub(want); d < -2*time.Second || d > 2*time.Second {
		b.t.Errorf("%s = %v, want about %v", what, got, want)
	}
}
