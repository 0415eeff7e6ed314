package storetest

import (
	"context"
	"strings"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

func testClaim(t *testing.T, h Harness) {
	t.Run("NewKeyIsAcquired", func(t *testing.T) {
		b := setup(t, h)
		scope, key := b.names()
		p := b.claimParams(scope, key, fpA)
		now := b.clock.Now()
		r := b.mustOutcome(p, idemstore.ClaimAcquired)
		if r.TookOver {
			t.Error("TookOver set on a new key")
		}
		if r.Record.State != idemstore.StateInFlight {
			t.Errorf("State = %v, want in flight", r.Record.State)
		}
		if r.Record.Fingerprint != fpA {
			t.Errorf("Fingerprint = %q, want %q", r.Record.Fingerprint, fpA)
		}
		b.near("ExpiresAt", r.Record.ExpiresAt, now.Add(b.ttl))
		b.near("LeaseExpiresAt", r.Record.LeaseExpiresAt, now.Add(b.lease))
	})

	t.Run("DuplicateWhileInFlight", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		first := b.claim(b.other(p))
		if first.Outcome != idemstore.ClaimInFlight {
			t.Fatalf("duplicate claim = %v, want in flight", first.Outcome)
		}
		if first.Record.State != idemstore.StateInFlight || first.Record.Fingerprint != fpA {
			t.Errorf("duplicate sees record %+v", first.Record)
		}
		// The duplicate must not have become the owner.
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("owner Complete after a duplicate claim: %v", err)
		}
	})

	t.Run("MismatchWhileInFlight", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		q := b.other(p)
		q.Fingerprint = fpB
		r := b.mustOutcome(q, idemstore.ClaimMismatch)
		if r.Record.Fingerprint != fpA {
			t.Errorf("mismatch reports fingerprint %q, want the stored %q", r.Record.Fingerprint, fpA)
		}
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("owner Complete after a mismatching claim: %v", err)
		}
	})

	t.Run("CompletedIsReplayed", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		acquiredExpiry := b.claim(b.other(p)).Record.ExpiresAt
		want := sampleResponse()
		if err := b.complete(p, want); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		r := b.mustOutcome(b.other(p), idemstore.ClaimCompleted)
		if r.Record.State != idemstore.StateCompleted {
			t.Errorf("State = %v, want completed", r.Record.State)
		}
		if d := sameResponse(r.Record.Response, want); d != "" {
			t.Errorf("replayed response: %s", d)
		}
		if !r.Record.ExpiresAt.Equal(acquiredExpiry) {
			t.Errorf("Complete changed ExpiresAt from %v to %v", acquiredExpiry, r.Record.ExpiresAt)
		}
		// Replays are stable.
		r2 := b.mustOutcome(b.other(p), idemstore.ClaimCompleted)
		if d := sameResponse(r2.Record.Response, want); d != "" {
			t.Errorf("second replay: %s", d)
		}
	})

	t.Run("MismatchAfterCompletion", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		q := b.other(p)
		q.Fingerprint = fpB
		r := b.mustOutcome(q, idemstore.ClaimMismatch)
		if r.Record.Fingerprint != fpA {
			t.Errorf("mismatch reports fingerprint %q, want %q", r.Record.Fingerprint, fpA)
		}
	})

	t.Run("ScopesAreIsolated", func(t *testing.T) {
		b := setup(t, h)
		_, key := b.names()
		a := b.claimParams(idem.Scope("tenant-a", "POST /pay"), key, fpA)
		c := b.claimParams(idem.Scope("tenant-b", "POST /pay"), key, fpB)
		d := b.claimParams(idem.Scope("tenant-a", "POST /refund"), key, fpB)
		b.mustOutcome(a, idemstore.ClaimAcquired)
		b.mustOutcome(c, idemstore.ClaimAcquired)
		b.mustOutcome(d, idemstore.ClaimAcquired)
		want := sampleResponse()
		if err := b.complete(a, want); err != nil {
			t.Fatalf("Complete a: %v", err)
		}
		b.mustOutcome(b.other(c), idemstore.ClaimInFlight)
		b.mustOutcome(b.other(d), idemstore.ClaimInFlight)
		r := b.mustOutcome(b.other(a), idemstore.ClaimCompleted)
		if diff := sameResponse(r.Record.Response, want); diff != "" {
			t.Errorf("tenant a replay: %s", diff)
		}
	})

	t.Run("KeysAreIsolated", func(t *testing.T) {
		b := setup(t, h)
		scope, _ := b.names()
		b.mustOutcome(b.claimParams(scope, "k1", fpA), idemstore.ClaimAcquired)
		b.mustOutcome(b.claimParams(scope, "k2", fpA), idemstore.ClaimAcquired)
		b.mustOutcome(b.claimParams(scope, "K1", fpA), idemstore.ClaimAcquired)
	})

	t.Run("UnusualKeysAndScopes", func(t *testing.T) {
		b := setup(t, h)
		keys := []string{
			`a"b\c`, "with space", "{hash}tag", "colon:pipe|percent%", "*", "?", "[x]",
			strings.Repeat("k", idem.MaxKeyLength), "~!@#$^&()_+=-`", "'; DROP TABLE x; --",
		}
		scopes := []string{idem.Scope("", "POST /a"), idem.Scope("tenant/ünïcode", "POST /a"), idem.Scope("{t}", "PATCH /b/{id}")}
		for _, scope := range scopes {
			for _, key := range keys {
				p := b.claimParams(scope, key, fpA)
				b.mustOutcome(p, idemstore.ClaimAcquired)
				want := sampleResponse()
				want.Body = []byte(scope + "/" + key)
				if err := b.complete(p, want); err != nil {
					t.Fatalf("Complete(%q, %q): %v", scope, key, err)
				}
				r := b.mustOutcome(b.other(p), idemstore.ClaimCompleted)
				if d := sameResponse(r.Record.Response, want); d != "" {
					t.Errorf("(%q, %q): %s", scope, key, d)
				}
			}
		}
	})

	t.Run("ReleasedKeyIsNew", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := b.release(p); err != nil {
			t.Fatalf("Release: %v", err)
		}
		q := b.other(p)
		r := b.mustOutcome(q, idemstore.ClaimAcquired)
		if r.TookOver {
			t.Error("TookOver set on a released key")
		}
		if err := b.release(q); err != nil {
			t.Fatalf("second Release: %v", err)
		}
		// A released key is free for any request, also another payload.
		z := b.other(p)
		z.Fingerprint = fpB
		b.mustOutcome(z, idemstore.ClaimAcquired)
	})

	t.Run("CancelledContext", func(t *testing.T) {
		b := setup(t, h)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		scope, key := b.names()
		if _, err := b.store.Claim(ctx, b.claimParams(scope, key, fpA)); err == nil {
			t.Error("Claim with a cancelled context succeeded")
		}
	})
}
