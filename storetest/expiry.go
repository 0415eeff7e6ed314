package storetest

import (
	"testing"

	"github.com/idemhq/idem/idemstore"
)

func testExpiry(t *testing.T, h Harness) {
	t.Run("ExpiredRecordIsAbsent", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		b.mustOutcome(b.other(p), idemstore.ClaimCompleted)
		b.clock.Advance(b.ttl + b.lease/4)
		// After its TTL the key is new, for any payload.
		q := b.other(p)
		q.Fingerprint = fpB
		r := b.mustOutcome(q, idemstore.ClaimAcquired)
		if r.TookOver {
			t.Error("TookOver set when claiming over an expired record")
		}
	})

	t.Run("DeleteExpiredInBatches", func(t *testing.T) {
		b := setup(t, h)
		const old, fresh, limit = 25, 5, 10
		var olds, freshes []idemstore.ClaimParams
		for i := range old {
			p := b.acquire(fpA)
			if i%2 == 0 {
				if err := b.complete(p, sampleResponse()); err != nil {
					t.Fatalf("Complete: %v", err)
				}
			}
			olds = append(olds, p)
		}
		b.clock.Advance(b.ttl / 2)
		for range fresh {
			freshes = append(freshes, b.acquire(fpA))
		}
		// The old records have expired; the fresh ones have half their
		// TTL left.
		b.clock.Advance(b.ttl/2 + b.lease/4)
		var counts []int
		total := 0
		for {
			n, err := b.store.DeleteExpired(b.ctx, idemstore.DeleteExpiredParams{Limit: limit, Now: b.clock.Now()})
			if err != nil {
				t.Fatalf("DeleteExpired: %v", err)
			}
			if n > limit {
				t.Fatalf("DeleteExpired deleted %d records, limit %d", n, limit)
			}
			counts = append(counts, n)
			total += n
			if n < limit || len(counts) > old {
				break
			}
		}
		want := old
		if h.SelfExpiring {
			want = 0 // the backend already deleted them
		}
		if total != want {
			t.Errorf("DeleteExpired deleted %d records in batches %v, want %d", total, counts, want)
		}
		// The unexpired records survived: their owners can still complete
		// them.
		for _, p := range freshes {
			if err := b.complete(p, sampleResponse()); err != nil {
				t.Fatalf("Complete of an unexpired record after DeleteExpired: %v", err)
			}
		}
		for _, p := range olds {
			if err := b.complete(p, sampleResponse()); err == nil {
				t.Error("Complete of a deleted record succeeded")
				break
			}
		}
	})

	t.Run("DeleteExpiredRejectsBadLimit", func(t *testing.T) {
		b := setup(t, h)
		if _, err := b.store.DeleteExpired(b.ctx, idemstore.DeleteExpiredParams{Limit: 0, Now: b.clock.Now()}); err == nil {
			t.Error("DeleteExpired with limit 0 succeeded")
		}
	})
}
