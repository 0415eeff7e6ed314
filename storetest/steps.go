package storetest

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
)

// testFence checks Record.Fence: every claim that acquires a key (new,
// after a release, after expiry, a take-over) gets a fence greater than
// every earlier one for that key.
func testFence(t *testing.T, h Harness) {
	t.Run("GrowsAcrossClaims", func(t *testing.T) {
		b := setup(t, h)
		scope, key := b.names()
		q := b.claimParams(scope, key, fpA)
		fresh := b.mustOutcome(q, idemstore.ClaimAcquired)
		if fresh.Record.Fence <= 0 {
			t.Fatalf("fence of a new record = %d, want > 0", fresh.Record.Fence)
		}
		last := fresh.Record.Fence
		// Release, then claim again: greater.
		if err := b.release(q); err != nil {
			t.Fatalf("Release: %v", err)
		}
		q2 := b.other(q)
		again := b.mustOutcome(q2, idemstore.ClaimAcquired)
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

// testSteps checks the optional idemstore.StepStore capability.
func testSteps(t *testing.T, h Harness) {
	probe := h.NewStore(t)
	if _, ok := probe.(idemstore.StepStore); !ok {
		t.Skip("the store does not implement idemstore.StepStore")
	}
	ss := func(b *bundle) idemstore.StepStore { return b.store.(idemstore.StepStore) }
	save := func(b *bundle, p idemstore.ClaimParams, cp string, end bool) error {
		return ss(b).SaveCheckpoint(b.ctx, idemstore.SaveCheckpointParams{Scope: p.Scope, Key: p.Key, Token: p.Token,
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
		b.mustOutcome(b.other(p), idemstore.ClaimInFlight)
		b.clock.Advance(b.lease + b.lease/4)
		next := b.other(p)
		r := b.takeOver(next)
		if !r.TookOver || string(r.Record.Checkpoint) != "two" {
			t.Fatalf("take-over: TookOver %v, checkpoint %q; want true, %q", r.TookOver, r.Record.Checkpoint, "two")
		}
		// The stale owner can no longer save.
		if err := save(b, p, "stale", false); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("stale SaveCheckpoint: %v, want ErrLeaseLost", err)
		}
		if err := b.complete(next, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if err := save(b, next, "late", false); !errors.Is(err, idemstore.ErrLeaseLost) {
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
		b.mustOutcome(q, idemstore.ClaimMismatch)
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
		r := b.mustOutcome(b.other(p), idemstore.ClaimAcquired)
		if r.TookOver || len(r.Record.Checkpoint) != 0 {
			t.Errorf("claim after release: TookOver %v, checkpoint %q; want a fresh record", r.TookOver, r.Record.Checkpoint)
		}
	})

	t.Run("WrongTokenAndUnknownRecord", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := save(b, b.other(p), "x", false); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("SaveCheckpoint with a wrong token: %v, want ErrLeaseLost", err)
		}
		scope, key := b.names()
		if err := save(b, b.claimParams(scope, key, fpA), "x", false); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("SaveCheckpoint of an unknown record: %v, want ErrLeaseLost", err)
		}
		b.mustOutcome(b.claimParams(scope, key, fpA), idemstore.ClaimAcquired)
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
		recs, err := ss(b).Stuck(b.ctx, idemstore.StuckParams{Limit: 10, Now: b.clock.Now()})
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
		b.mustOutcome(b.other(stuck), idemstore.ClaimAcquired)
		recs, err = ss(b).Stuck(b.ctx, idemstore.StuckParams{Limit: 10, Now: b.clock.Now()})
		if err != nil {
			t.Fatalf("Stuck: %v", err)
		}
		for _, r := range recs {
			if r.Key == stuck.Key {
				t.Error("a record taken over is still listed as stuck")
			}
		}
	})

	t.Run("ResumesNeverExtendRetention", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		first := b.mustOutcome(b.other(p), idemstore.ClaimInFlight).Record.ExpiresAt
		// A reconciler resuming in vain: save with the lease ended, take
		// over at once, again and again. None of it moves the retention.
		q := p
		for i := range 20 {
			if err := save(b, q, "again", true); err != nil {
				t.Fatalf("SaveCheckpoint EndLease %d: %v", i, err)
			}
			if !h.ServerClock {
				b.clock.Advance(time.Minute) // real time passes by itself
			}
			q = b.other(q)
			r := b.mustOutcome(q, idemstore.ClaimAcquired)
			if !r.TookOver || !r.Record.ExpiresAt.Equal(first) {
				t.Fatalf("resume %d: TookOver %v, ExpiresAt %v; want a take-over with the first claim's retention %v",
					i+1, r.TookOver, r.Record.ExpiresAt, first)
			}
		}
		if err := save(b, q, "last", true); err != nil {
			t.Fatalf("SaveCheckpoint EndLease: %v", err)
		}
		// The record ends with the first claim's TTL: not stuck any more,
		// a claim is a fresh one, and cleanup deletes it.
		b.clock.Advance(first.Sub(b.clock.Now()) + b.lease/4)
		recs, err := ss(b).Stuck(b.ctx, idemstore.StuckParams{Limit: 10, Now: b.clock.Now()})
		if err != nil {
			t.Fatalf("Stuck: %v", err)
		}
		for _, r := range recs {
			if r.Key == p.Key {
				t.Error("Stuck still lists the record after the first claim's retention ended")
			}
		}
		if !h.SelfExpiring {
			n, err := b.store.DeleteExpired(b.ctx, idemstore.DeleteExpiredParams{Limit: 10, Now: b.clock.Now()})
			if err != nil || n != 1 {
				t.Errorf("DeleteExpired = %d, %v; want the resumed record deleted", n, err)
			}
		}
		r := b.mustOutcome(b.other(q), idemstore.ClaimAcquired)
		if r.TookOver || len(r.Record.Checkpoint) != 0 {
			t.Errorf("claim after the retention: TookOver %v, checkpoint %q; want a fresh record", r.TookOver, r.Record.Checkpoint)
		}
	})

	t.Run("HeldRecordsAreLeftForAnOperator", func(t *testing.T) {
		b := setup(t, h)
		hold := func(p idemstore.ClaimParams, cp string, end bool) error {
			return ss(b).SaveCheckpoint(b.ctx, idemstore.SaveCheckpointParams{Scope: p.Scope, Key: p.Key, Token: p.Token,
				Checkpoint: []byte(cp), EndLease: end, Hold: true, Now: b.clock.Now()})
		}
		held := b.acquire(fpA)
		if err := hold(held, "held", true); err != nil {
			t.Fatalf("SaveCheckpoint Hold: %v", err)
		}
		heldNoEnd := b.acquire(fpA) // Hold alone ends the lease too
		if err := hold(heldNoEnd, "held too", false); err != nil {
			t.Fatalf("SaveCheckpoint Hold without EndLease: %v", err)
		}
		stuck := b.acquire(fpA)
		if err := save(b, stuck, "stuck", true); err != nil {
			t.Fatalf("SaveCheckpoint EndLease: %v", err)
		}
		keys := func(held bool) map[string]idemstore.StuckRecord {
			t.Helper()
			recs, err := ss(b).Stuck(b.ctx, idemstore.StuckParams{Limit: 10, Held: held, Now: b.clock.Now()})
			if err != nil {
				t.Fatalf("Stuck (held %v): %v", held, err)
			}
			out := map[string]idemstore.StuckRecord{}
			for _, r := range recs {
				out[r.Key] = r
			}
			return out
		}
		got := keys(false)
		if _, ok := got[stuck.Key]; !ok || len(got) != 1 {
			t.Errorf("Stuck = %v, want only the stuck record %q", got, stuck.Key)
		}
		got = keys(true)
		if len(got) != 2 || string(got[held.Key].Checkpoint) != "held" || string(got[heldNoEnd.Key].Checkpoint) != "held too" {
			t.Errorf("Stuck held = %v, want the two held records with their checkpoints", got)
		}
		for _, r := range got {
			if r.Fingerprint != fpA || !(idemstore.Record{State: idemstore.StateInFlight, LeaseExpiresAt: r.LeaseExpiresAt}).Held() {
				t.Errorf("held record %q: fingerprint %q, lease end %v", r.Key, r.Fingerprint, r.LeaseExpiresAt)
			}
		}
		if in, ok := b.store.(idemstore.Inspector); ok {
			ri, err := in.Get(b.ctx, idemstore.GetParams{Scope: held.Scope, Key: held.Key, Now: b.clock.Now()})
			if err != nil || !ri.Held() {
				t.Errorf("Inspector.Get of a held record: Held %v, %v", ri.Held(), err)
			}
			ri, err = in.Get(b.ctx, idemstore.GetParams{Scope: stuck.Scope, Key: stuck.Key, Now: b.clock.Now()})
			if err != nil || ri.Held() {
				t.Errorf("Inspector.Get of a stuck record: Held %v, %v", ri.Held(), err)
			}
		}
		// Another payload is still refused; a retry with the same one takes
		// the held record over at once and resumes it.
		b.mustOutcome(b.claimParams(held.Scope, held.Key, fpB), idemstore.ClaimMismatch)
		next := b.other(held)
		r := b.mustOutcome(next, idemstore.ClaimAcquired)
		if !r.TookOver || string(r.Record.Checkpoint) != "held" || r.Record.Held() {
			t.Fatalf("claim of a held record: TookOver %v, checkpoint %q, held %v; want a take-over with a live lease", r.TookOver, r.Record.Checkpoint, r.Record.Held())
		}
		if _, ok := keys(true)[held.Key]; ok {
			t.Error("a held record that was taken over is still listed as held")
		}
		// The stale owner cannot hold it again.
		if err := hold(held, "stale", true); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("stale SaveCheckpoint Hold: %v, want ErrLeaseLost", err)
		}
		// Held again by its new owner, then ended with an ordinary
		// EndLease: stuck again.
		if err := hold(next, "held again", true); err != nil {
			t.Fatalf("SaveCheckpoint Hold: %v", err)
		}
		again := b.other(next)
		b.mustOutcome(again, idemstore.ClaimAcquired)
		if err := save(b, again, "released to reconciliation", true); err != nil {
			t.Fatalf("SaveCheckpoint EndLease: %v", err)
		}
		if _, ok := keys(false)[held.Key]; !ok {
			t.Error("a record saved with EndLease after being held is not stuck")
		}
		// Completing a held record's resumption ends it as any other.
		last := b.other(again)
		b.mustOutcome(last, idemstore.ClaimAcquired)
		if err := b.complete(last, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		b.mustOutcome(b.other(last), idemstore.ClaimCompleted)
	})

	t.Run("OneResumerAmong32", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := save(b, p, "point", true); err != nil {
			t.Fatalf("SaveCheckpoint EndLease: %v", err)
		}
		const n = 32
		rs := b.race(n, func(int) (idemstore.ClaimResult, error) {
			return b.store.Claim(b.ctx, idemstore.ClaimParams{Scope: p.Scope, Key: p.Key, Fingerprint: fpA, Token: b.token(),
				Lease: b.lease, TTL: b.ttl, Now: b.clock.Now()})
		})
		if got := count(rs, idemstore.ClaimAcquired); got != 1 {
			t.Fatalf("%d of %d concurrent claims resumed the record, want 1", got, n)
		}
		for _, r := range rs {
			if r.Outcome == idemstore.ClaimAcquired && string(r.Record.Checkpoint) != "point" {
				t.Errorf("the resumer got checkpoint %q", r.Record.Checkpoint)
			}
		}
		if got := count(rs, idemstore.ClaimInFlight); got != n-1 {
			t.Errorf("%d claims answered in flight, want %d", got, n-1)
		}
	})
}
