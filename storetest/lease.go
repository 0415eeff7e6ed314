package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
)

func testLease(t *testing.T, h Harness) {
	t.Run("ExpiredLeaseIsTakenOver", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		b.mustOutcome(b.other(p), idemstore.ClaimInFlight)
		b.clock.Advance(b.lease + b.lease/4)
		now := b.clock.Now()
		r := b.takeOver(b.other(p))
		if !r.TookOver {
			t.Error("TookOver not set")
		}
		// The taker-over starts a fresh lease; the retention stays the
		// first claim's.
		b.near("ExpiresAt after take-over", r.Record.ExpiresAt, p.Now.Add(b.ttl))
		b.near("LeaseExpiresAt after take-over", r.Record.LeaseExpiresAt, now.Add(b.lease))
		b.mustOutcome(b.other(p), idemstore.ClaimInFlight)
	})

	t.Run("TakeOverNeverExtendsRetention", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		first := b.mustOutcome(b.other(p), idemstore.ClaimInFlight).Record.ExpiresAt
		// Take-over after take-over, each after the last one's lease: the
		// record still ends TTL after the claim that created it. (A
		// server clock lets only one take-over fit in its short TTL.)
		takeOvers := 10
		if h.ServerClock {
			takeOvers = 1
		}
		q := p
		for i := range takeOvers {
			b.clock.Advance(b.lease + b.lease/4)
			q = b.other(q)
			r := b.mustOutcome(q, idemstore.ClaimAcquired)
			if !r.TookOver {
				t.Fatalf("take-over %d: TookOver not set", i+1)
			}
			if !r.Record.ExpiresAt.Equal(first) {
				t.Fatalf("take-over %d moved ExpiresAt from %v to %v", i+1, first, r.Record.ExpiresAt)
			}
		}
		// Past the first claim's TTL the record has expired, abandoned
		// lease and all: the key is new again.
		b.clock.Advance(first.Sub(b.clock.Now()) + b.lease/4)
		r := b.mustOutcome(b.other(q), idemstore.ClaimAcquired)
		if r.TookOver {
			t.Errorf("a claim %v after the first claim's retention ended took the record over: the take-overs extended it", b.clock.Now().Sub(first))
		}
		if err := b.complete(q, sampleResponse()); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Complete by the last taker-over after the retention ended: %v, want ErrLeaseLost", err)
		}
	})

	t.Run("RenewExtendsLease", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		b.clock.Advance(b.lease * 3 / 5)
		if err := b.renew(p); err != nil {
			t.Fatalf("Renew: %v", err)
		}
		b.clock.Advance(b.lease * 3 / 5)
		// 1.2 leases after the claim, 0.6 after the renewal.
		b.mustOutcome(b.other(p), idemstore.ClaimInFlight)
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("Complete after renewal: %v", err)
		}
	})

	t.Run("ExpiredButNotTakenOverIsStillOwned", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		b.clock.Advance(b.lease + b.lease/4)
		if err := b.renew(p); err != nil {
			t.Fatalf("Renew of an expired lease nobody took over: %v", err)
		}
		b.mustOutcome(b.other(p), idemstore.ClaimInFlight)
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
	})

	t.Run("ExpiredLeaseIsNotTakenOverByAnotherPayload", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		b.clock.Advance(b.lease + b.lease/4)
		q := b.other(p)
		q.Fingerprint = fpB
		b.mustOutcome(q, idemstore.ClaimMismatch)
		// The original owner still owns it.
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("owner Complete: %v", err)
		}
	})

	if h.ServerClock {
		t.Run("SkewedCallerClockIsIgnored", func(t *testing.T) {
			b := setup(t, h)
			scope, key := b.names()
			p := b.claimParams(scope, key, fpA)
			b.mustOutcome(p, idemstore.ClaimAcquired)
			// An instance whose clock runs an hour (or a day) ahead must
			// not see the lease as expired, nor one running behind see
			// a future lease.
			for _, skew := range []time.Duration{time.Hour, 24 * time.Hour, -time.Hour} {
				q := b.other(p)
				q.Now = time.Now().Add(skew)
				r, err := b.store.Claim(b.ctx, q)
				if err != nil {
					t.Fatalf("Claim with skew %v: %v", skew, err)
				}
				if r.Outcome != idemstore.ClaimInFlight {
					t.Errorf("Claim with the caller's clock %v off = %v, want in flight", skew, r.Outcome)
				}
			}
			if err := b.store.Renew(b.ctx, idemstore.RenewParams{Scope: p.Scope, Key: p.Key, Token: p.Token,
				Lease: b.lease, Now: time.Now().Add(-48 * time.Hour)}); err != nil {
				t.Fatalf("Renew with a skewed clock: %v", err)
			}
			if err := b.complete(p, sampleResponse()); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			// Nor must a skewed clock make a completed record look
			// expired.
			q := b.other(p)
			q.Now = time.Now().Add(48 * time.Hour)
			r, err := b.store.Claim(b.ctx, q)
			if err != nil || r.Outcome != idemstore.ClaimCompleted {
				t.Errorf("Claim with the caller's clock two days ahead = %v, %v; want completed", r.Outcome, err)
			}
		})
	}
}
