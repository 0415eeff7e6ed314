package redisstore_test

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/redis/go-redis/v9"
)

// oldStore runs the scripts of the previous release, v0.2.0 (kept in
// testdata/v0.2.0), as its Store did: what an instance not yet upgraded
// sends during a rolling upgrade.
type oldStore struct {
	c                                 redis.UniversalClient
	claim, complete, release, renewal *redis.Script
}

func newOldStore(t *testing.T, c redis.UniversalClient) *oldStore {
	load := func(name string) *redis.Script {
		b, err := os.ReadFile("testdata/v0.2.0/" + name + ".lua")
		if err != nil {
			t.Fatal(err)
		}
		return redis.NewScript(string(b))
	}
	return &oldStore{c: c, claim: load("claim"), complete: load("complete"), release: load("release"), renewal: load("renew")}
}

// Claim returns v0.2.0's reply: {outcome, took over, lease end, expires
// at, fingerprint[, encoded response | fence]}.
func (o *oldStore) Claim(t *testing.T, key, fp, token string) []any {
	t.Helper()
	v, err := o.claim.Run(t.Context(), o.c, []string{key}, fp, token, int64(200), time.Hour.Milliseconds()).Slice()
	if err != nil {
		t.Fatalf("v0.2.0 claim: %v", err)
	}
	return v
}

// Owned runs complete, release or renew and returns its reply (1 done, 0
// not the owner).
func (o *oldStore) Owned(t *testing.T, script *redis.Script, key string, args ...any) int64 {
	t.Helper()
	n, err := script.Run(t.Context(), o.c, []string{key}, args...).Int64()
	if err != nil {
		t.Fatalf("v0.2.0 script: %v", err)
	}
	return n
}

// Instances of v0.2.0 and of this version share records during a rolling
// upgrade. The record format is the same, so each replays, completes,
// takes over and releases what the other wrote, and fences keep growing.
func TestRollingUpgrade(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	old := newOldStore(t, c)
	ctx := t.Context()
	scope := idem.Scope("t", "POST /x")
	resp := &idemstore.Response{StatusCode: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"ok":true}`)}
	enc, err := resp.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	claim := func(t *testing.T, key, fp, token string) idemstore.ClaimResult {
		t.Helper()
		r, err := s.Claim(ctx, idemstore.ClaimParams{Scope: scope, Key: key, Fingerprint: fp, Token: token, Lease: 200 * time.Millisecond, TTL: time.Hour})
		if err != nil {
			t.Fatalf("Claim %s: %v", key, err)
		}
		return r
	}
	replays := func(t *testing.T, key string) {
		t.Helper()
		if r := claim(t, key, fpA, "retry"); r.Outcome != idemstore.ClaimCompleted || r.Record.Response == nil || !bytes.Equal(r.Record.Response.Body, resp.Body) {
			t.Errorf("%s: this version's replay: %v %+v", key, r.Outcome, r.Record.Response)
		}
		if v := old.Claim(t, s.Key(scope, key), fpA, "retry"); v[0] != int64(2) || len(v) < 6 || v[5] != string(enc) {
			t.Errorf("%s: v0.2.0's replay: %q", key, v)
		}
	}

	t.Run("OldClaimNewComplete", func(t *testing.T) {
		t.Parallel()
		if v := old.Claim(t, s.Key(scope, "a"), fpA, "owner"); v[0] != int64(1) {
			t.Fatalf("v0.2.0 claim: %v", v)
		}
		if r := claim(t, "a", fpA, "other"); r.Outcome != idemstore.ClaimInFlight {
			t.Errorf("claim of v0.2.0's in-flight record: %v", r.Outcome)
		}
		if r := claim(t, "a", fpB, "other"); r.Outcome != idemstore.ClaimMismatch || r.Record.Fingerprint != fpA {
			t.Errorf("claim with another fingerprint: %v %q", r.Outcome, r.Record.Fingerprint)
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Scope: scope, Key: "a", Token: "owner", Response: resp}); err != nil {
			t.Fatalf("Complete of v0.2.0's claim: %v", err)
		}
		replays(t, "a")
	})

	t.Run("NewClaimOldComplete", func(t *testing.T) {
		t.Parallel()
		if r := claim(t, "b", fpA, "owner"); r.Outcome != idemstore.ClaimAcquired {
			t.Fatalf("claim: %v", r.Outcome)
		}
		if v := old.Claim(t, s.Key(scope, "b"), fpA, "other"); v[0] != int64(3) {
			t.Errorf("v0.2.0 claim of an in-flight record: %v", v)
		}
		if n := old.Owned(t, old.renewal, s.Key(scope, "b"), "owner", int64(200)); n != 1 {
			t.Errorf("v0.2.0 renew: %d", n)
		}
		if n := old.Owned(t, old.complete, s.Key(scope, "b"), "owner", string(enc)); n != 1 {
			t.Fatalf("v0.2.0 complete: %d", n)
		}
		replays(t, "b")
	})

	t.Run("TakeOverAcrossVersions", func(t *testing.T) {
		t.Parallel()
		v := old.Claim(t, s.Key(scope, "c"), fpA, "first")
		if v[0] != int64(1) || len(v) < 6 {
			t.Fatalf("v0.2.0 claim: %v", v)
		}
		oldFence, _ := v[5].(int64)
		waitUntil(time.UnixMilli(v[2].(int64)).Add(5 * time.Millisecond)) // its lease ended
		r := claim(t, "c", fpA, "second")
		if r.Outcome != idemstore.ClaimAcquired || !r.TookOver || r.Record.Fence <= oldFence {
			t.Fatalf("take-over of v0.2.0's record: %v took over %v, fence %d after %d", r.Outcome, r.TookOver, r.Record.Fence, oldFence)
		}
		if !r.Record.ExpiresAt.Equal(time.UnixMilli(v[3].(int64))) {
			t.Errorf("take-over changed the retention: %v, was %v", r.Record.ExpiresAt, time.UnixMilli(v[3].(int64)))
		}
		if n := old.Owned(t, old.complete, s.Key(scope, "c"), "first", string(enc)); n != 0 {
			t.Errorf("v0.2.0 complete by the stale owner: %d, want 0", n)
		}
		waitUntil(r.Record.LeaseExpiresAt.Add(5 * time.Millisecond))
		v = old.Claim(t, s.Key(scope, "c"), fpA, "third")
		if v[0] != int64(1) || v[1] != int64(1) || v[5].(int64) <= r.Record.Fence {
			t.Fatalf("v0.2.0 take-over: %v, after fence %d", v, r.Record.Fence)
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Scope: scope, Key: "c", Token: "second", Response: resp}); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Complete by the stale owner: %v, want ErrLeaseLost", err)
		}
		if err := s.Complete(ctx, idemstore.CompleteParams{Scope: scope, Key: "c", Token: "third", Response: resp}); err != nil {
			t.Fatalf("Complete of v0.2.0's take-over: %v", err)
		}
		replays(t, "c")
	})

	t.Run("ReleaseAcrossVersions", func(t *testing.T) {
		t.Parallel()
		if r := claim(t, "d", fpA, "owner"); r.Outcome != idemstore.ClaimAcquired {
			t.Fatalf("claim: %v", r.Outcome)
		}
		if n := old.Owned(t, old.release, s.Key(scope, "d"), "owner"); n != 1 {
			t.Errorf("v0.2.0 release: %d", n)
		}
		if v := old.Claim(t, s.Key(scope, "e"), fpA, "owner"); v[0] != int64(1) {
			t.Fatalf("v0.2.0 claim: %v", v)
		}
		if err := s.Release(ctx, idemstore.ReleaseParams{Scope: scope, Key: "e", Token: "owner"}); err != nil {
			t.Errorf("Release of v0.2.0's claim: %v", err)
		}
		for _, k := range []string{"d", "e"} {
			if n, err := c.Exists(ctx, s.Key(scope, k)).Result(); err != nil || n != 0 {
				t.Errorf("%s after its release: exists %d, %v", k, n, err)
			}
		}
	})
}
