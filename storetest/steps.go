package storetest

import (
	"bytes"
	"errors"
	"testing"

	"github.com/idemhq/idem"
)

// testFence checks Record.Fence: every claim that acquires a key (new,
// after a release, after expiry, a take-over) gets a fence greater than
// every earlier one for that key.
func testFence(t *testing.T, h Harness) {
	t.Run("GrowsAcrossClaims", func(t *testing.T) {
		b := setup(t, h)
		scope, key := b.names()
		q := b.claimParams(scope, key, fpA)
		fresh := b.mustOutcome(q, idem.ClaimAcquired)
		if fresh.Record.Fence <= 0 {
			t.Fatalf("fence of a new record = %d, want > 0", fresh.Record.Fence)
		}
		last := fresh.Record.Fence
		// Release, then claim again: greater.
		if err := b.release(q); err != nil {
			t.Fatalf("Release: %v", err)
		}
		q2 := b.other(q)
		again := b.mustOutcome(q2, idem.ClaimAcquired)
		if again.Record.Fence <= last {
			t.Errorf("fence after release = %d, want > %d", again.Record.Fence, last)
		}
		last = again.Record.Fence
		// Take-over: greater.
		b.clock.Advance(b.lease + b.lease/4)
		q3 := b.other(q2)
		took := b.takeOver(q3)
		if !took.TookOver {
			t.Fatal("no take-over after the lease")
		}
		if took.Record.Fence <= last {
			t.Errorf("fence after take-over = %d, want > %d", took.Record.Fence, last)
		}
	})
}

// testSteps checks the optional idem.StepStore capability.
func testSteps(t *testing.T, h Harness) {
	probe := h.NewStore(t)
	if _, ok := probe.(idem.StepStore); !ok {
		t.Skip("the store does not implement idem.StepStore")
	}
	ss := func(b *bundle) idem.StepStore { return b.store.(idem.StepStore) }
	save := func(b *bundle, p idem.ClaimParams, cp string, end bool) error {
		return ss(b).SaveCheckpoint(b.ctx, idem.SaveCheckpointParams{Scope: p.Scope, Key: p.Key, Token: p.Token,
			Checkpoint: []byte(cp), EndLease: end, Now: b.clock.Now()})
	}

	t.Run("TakeOverSeesCheckpoint", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := save(b, p, "one", false); err != nil {
			t.Fatalf("SaveCheckpoint: %v", err)
		}
		if err := save(b, p, "two", false); err != nil {
			t.Fatalf("second SaveCheckpoint: %v", err)
		}
		b.mustOutcome(b.other(p), idem.ClaimInFlight)
		b.clock.Advance(b.lease + b.lease/4)
		next := b.other(p)
		r := b.takeOver(next)
		if !r.TookOver || string(r.Record.Checkpoint) != "two" {
			t.Fatalf("take-over: TookOver %v, checkpoint %q; want true, %q", r.TookOver, r.Record.Checkpoint, "two")
		}
		// The stale owner can no longer save.
		if err := save(b, p, "stale", false); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("stale SaveCheckpoint: %v, want ErrLeaseLost", err)
		}
		if err := b.complete(next, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if err := save(b, next, "late", false); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("SaveCheckpoint after Complete: %v, want ErrLeaseLost", err)
		}
	})

	t.Run("EndLeaseLetsTheNextClaimResume", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := save(b, p, "point", true); err != nil {
			t.Fatalf("SaveCheckpoint EndLease: %v", err)
		}
		// No waiting: the lease ended at once.
		next := b.other(p)
		r := b.takeOver(next)
		if !r.TookOver || string(r.Record.Checkpoint) != "point" {
			t.Fatalf("claim after EndLease: TookOver %v, checkpoint %q", r.TookOver, r.Record.Checkpoint)
		}
		// Another fingerprint is still a mismatch.
		q := b.claimParams(p.Scope, p.Key, fpB)
		b.mustOutcome(q, idem.ClaimMismatch)
	})

	t.Run("ReleaseAndExpiryForgetTheCheckpoint", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := save(b, p, "gone", false); err != nil {
			t.Fatalf("SaveCheckpoint: %v", err)
		}
		if err := b.release(p); err != nil {
			t.Fatalf("Release: %v", err)
		}
		r := b.mustOutcome(b.other(p), idem.ClaimAcquired)
		if r.TookOver || len(r.Record.Checkpoint) != 0 {
			t.Errorf("claim after release: TookOver %v, checkpoint %q; want a fresh record", r.TookOver, r.Record.Checkpoint)
		}
	})

	t.Run("WrongTokenAndUnknownRecord", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := save(b, b.other(p), "x", false); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("SaveCheckpoint with a wrong token: %v, want ErrLeaseLost", err)
		}
		scope, key := b.names()
		if err := save(b, b.claimParams(scope, key, fpA), "x", false); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("SaveCheckpoint of an unknown record: %v, want ErrLeaseLost", err)
		}
		b.mustOutcome(b.claimParams(scope, key, fpA), idem.ClaimAcquired)
	})

	t.Run("StuckListsAbandonedRecordsWithACheckpoint", func(t *testing.T) {
		b := setup(t, h)
		stuck := b.acquire(fpA)
		if err := save(b, stuck, "s", true); err != nil {
			t.Fatalf("SaveCheckpoint: %v", err)
		}
		running := b.acquire(fpA)
		if err := save(b, running, "r", false); err != nil {
			t.Fatalf("SaveCheckpoint: %v", err)
		}
		plain := b.acquire(fpA) // no checkpoint
		_ = plain
		b.clock.Advance(b.lease / 10)
		recs, err := ss(b).Stuck(b.ctx, idem.StuckParams{Limit: 10, Now: b.clock.Now()})
		if err != nil {
			t.Fatalf("Stuck: %v", err)
		}
		found := false
		for _, r := range recs {
			if r.Key == running.Key || r.Key == plain.Key {
				t.Errorf("Stuck returned %q, which is not stuck", r.Key)
			}
			if r.Scope == stuck.Scope && r.Key == stuck.Key {
				found = true
				if r.Fingerprint != fpA || !bytes.Equal(r.Checkpoint, []byte("s")) {
					t.Errorf("stuck record: fingerprint %q checkpoint %q", r.Fingerprint, r.Checkpoint)
				}
			}
		}
		if !found {
			t.Errorf("Stuck = %d records without the abandoned one", len(recs))
		}
		// Taken over, it is no longer stuck.
		b.mustOutcome(b.other(stuck), idem.ClaimAcquired)
		recs, err = ss(b).Stuck(b.ctx, idem.StuckParams{Limit: 10, Now: b.clock.Now()})
		if err != nil {
			t.Fatalf("Stuck: %v", err)
		}
		for _, r := range recs {
			if r.Key == stuck.Key {
				t.Error("a record taken over is still listed as stuck")
			}
		}
	})

	t.Run("OneResumerAmong32", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := save(b, p, "point", true); err != nil {
			t.Fatalf("SaveCheckpoint EndLease: %v", err)
		}
		const n = 32
		rs := b.race(n, func(int) (idem.ClaimResult, error) {
			return b.store.Claim(b.ctx, idem.ClaimParams{Scope: p.Scope, Key: p.Key, Fingerprint: fpA, Token: b.token(),
				Lease: b.lease, TTL: b.ttl, Now: b.clock.Now()})
		})
		if got := count(rs, idem.ClaimAcquired); got != 1 {
			t.Fatalf("%d of %d concurrent claims resumed the record, want 1", got, n)
		}
		for _, r := range rs {
			if r.Outcome == idem.ClaimAcquired && string(r.Record.Checkpoint) != "point" {
				t.Errorf("the resumer got checkpoint %q", r.Record.Checkpoint)
			}
		}
		if got := count(rs, idem.ClaimInFlight); got != n-1 {
			t.Errorf("%d claims answered in flight, want %d", got, n-1)
		}
	})
}
