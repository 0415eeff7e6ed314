package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
)

// testClaimTx checks idemstore.TxClaimer, if the store has it: a claim written
// in an open transaction is invisible until it commits, gone after a
// rollback, never owned twice, and answers duplicates as Claim does.
func testClaimTx(t *testing.T, h Harness) {
	probe := h.NewStore(t)
	if _, ok := probe.(idemstore.TxClaimer); !ok {
		t.Skip("the store does not implement idemstore.TxClaimer")
	}
	claimTx := func(b *bundle, ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, idemstore.Tx, error) {
		b.t.Helper()
		p.Now = b.clock.Now()
		r, tx, err := b.store.(idemstore.TxClaimer).ClaimTx(ctx, p)
		switch {
		case err != nil:
		case tx != nil && r.Outcome != idemstore.ClaimAcquired:
			b.t.Errorf("ClaimTx(%q) = %v with a transaction: only ClaimAcquired may return one", p.Key, r.Outcome)
		case tx != nil && r.TookOver:
			b.t.Errorf("ClaimTx(%q) took a record over in an open transaction", p.Key)
		case tx == nil && r.Outcome == idemstore.ClaimAcquired && !r.TookOver:
			b.t.Errorf("ClaimTx(%q) acquired a new record without a transaction", p.Key)
		}
		return b.open(p, r), tx, err
	}
	mustClaimTx := func(b *bundle, p idemstore.ClaimParams, want idemstore.ClaimOutcome) (idemstore.ClaimResult, idemstore.Tx) {
		b.t.Helper()
		r, tx, err := claimTx(b, b.ctx, p)
		if err != nil {
			b.t.Fatalf("ClaimTx(%q): %v", p.Key, err)
		}
		if r.Outcome != want {
			if tx != nil {
				_ = tx.Rollback(b.ctx)
			}
			b.t.Fatalf("ClaimTx(%q) = %v, want %v", p.Key, r.Outcome, want)
		}
		return r, tx
	}
	commit := func(b *bundle, tx idemstore.Tx, p idemstore.ClaimParams, resp *idemstore.Response) {
		b.t.Helper()
		err := tx.Complete(b.ctx, idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: b.seal(p, resp), Now: b.clock.Now()})
		if err != nil {
			_ = tx.Rollback(b.ctx)
			b.t.Fatalf("tx Complete of a claim made in the transaction: %v", err)
		}
		if err := tx.Commit(b.ctx); err != nil {
			b.t.Fatalf("Commit: %v (%s)", err, b.describe(p))
		}
	}

	t.Run("CommitCompletes", func(t *testing.T) {
		b := setup(t, h)
		scope, key := b.names()
		p := b.claimParams(scope, key, fpA)
		r, tx := mustClaimTx(b, p, idemstore.ClaimAcquired)
		if r.TookOver || r.Record.State != idemstore.StateInFlight || r.Record.Fingerprint != fpA {
			t.Errorf("new claim's record = %+v, TookOver %v", r.Record, r.TookOver)
		}
		if r.Record.Fence <= 0 {
			t.Errorf("Fence = %d, want a positive fencing token", r.Record.Fence)
		}
		b.near("ExpiresAt", r.Record.ExpiresAt, p.Now.Add(b.ttl))
		want := sampleResponse()
		commit(b, tx, p, want)
		got := b.mustOutcome(b.other(p), idemstore.ClaimCompleted)
		if d := sameResponse(got.Record.Response, want); d != "" {
			t.Errorf("response committed with the claim: %s", d)
		}
		r2, _ := mustClaimTx(b, b.other(p), idemstore.ClaimCompleted)
		if d := sameResponse(r2.Record.Response, want); d != "" {
			t.Errorf("ClaimTx's replay: %s", d)
		}
		mustClaimTx(b, b.claimParams(scope, key, fpB), idemstore.ClaimMismatch)
	})

	t.Run("RollbackLeavesNothing", func(t *testing.T) {
		b := setup(t, h)
		scope, key := b.names()
		p := b.claimParams(scope, key, fpA)
		_, tx := mustClaimTx(b, p, idemstore.ClaimAcquired)
		if err := tx.Rollback(b.ctx); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
		// The key is as before the claim: new, for any fingerprint.
		r := b.mustOutcome(b.claimParams(scope, key, fpB), idemstore.ClaimAcquired)
		if r.TookOver {
			t.Error("a claim after a rolled-back ClaimTx took a record over; nothing should have been left")
		}
		if err := b.release(p); err == nil {
			t.Error("Release with the rolled-back claim's token succeeded")
		}
	})

	t.Run("AnswersDuplicatesWithoutTransaction", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		mustClaimTx(b, b.other(p), idemstore.ClaimInFlight)
		mustClaimTx(b, b.claimParams(p.Scope, p.Key, fpB), idemstore.ClaimMismatch)
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		r, _ := mustClaimTx(b, b.other(p), idemstore.ClaimCompleted)
		if d := sameResponse(r.Record.Response, sampleResponse()); d != "" {
			t.Errorf("replay: %s", d)
		}
	})

	t.Run("NeverTwoOwners", func(t *testing.T) {
		b := setup(t, h)
		scope, key := b.names()
		p := b.claimParams(scope, key, fpA)
		_, tx := mustClaimTx(b, p, idemstore.ClaimAcquired)
		// A claim of the key while the claim is uncommitted must not
		// acquire it: it answers "in progress" or fails at its deadline.
		ctx, cancel := context.WithTimeout(b.ctx, 300*time.Millisecond)
		q := b.other(p)
		q.Now = b.clock.Now()
		r, err := b.store.Claim(ctx, q)
		cancel()
		if err == nil && r.Outcome != idemstore.ClaimInFlight {
			_ = tx.Rollback(b.ctx)
			t.Fatalf("Claim while the key's claim is open in a transaction = %v, want in flight (or a timeout)", r.Outcome)
		}
		// Concurrent claims around the commit: none may acquire.
		type result struct {
			r   idemstore.ClaimResult
			tx  idemstore.Tx
			err error
		}
		done := make(chan result, 2)
		for _, viaTx := range []bool{false, true} {
			go func() {
				ctx, cancel := context.WithTimeout(b.ctx, 2*time.Second)
				defer cancel()
				q := b.other(p)
				q.Now = b.clock.Now()
				var res result
				if viaTx {
					res.r, res.tx, res.err = b.store.(idemstore.TxClaimer).ClaimTx(ctx, q)
				} else {
					res.r, res.err = b.store.Claim(ctx, q)
				}
				done <- res
			}()
		}
		// The duplicates answer (409) or wait; either way the first owner
		// commits, and then none of them may have acquired.
		commit(b, tx, p, sampleResponse())
		for range 2 {
			res := <-done
			if res.tx != nil {
				_ = res.tx.Rollback(b.ctx)
			}
			if res.err == nil && res.r.Outcome == idemstore.ClaimAcquired {
				t.Fatalf("a concurrent claim acquired a key whose claim was open in a transaction (TookOver %v)", res.r.TookOver)
			}
		}
		b.mustOutcome(b.other(p), idemstore.ClaimCompleted)
	})

	t.Run("ExpiredRecordClaimedAgain", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		b.clock.Advance(b.ttl + time.Second)
		q := b.claimParams(p.Scope, p.Key, fpB)
		r, tx := mustClaimTx(b, q, idemstore.ClaimAcquired)
		if r.TookOver {
			t.Error("claiming an expired record reported a take-over")
		}
		commit(b, tx, q, sampleResponse())
		b.mustOutcome(b.claimParams(p.Scope, p.Key, fpB), idemstore.ClaimCompleted)
	})

	t.Run("TakeOverAfterLease", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		b.clock.Advance(b.lease + b.lease/4)
		q := b.other(p)
		r, tx := mustClaimTx(b, q, idemstore.ClaimAcquired)
		if !r.TookOver {
			t.Error("ClaimTx of an abandoned record did not report TookOver")
		}
		if tx != nil {
			_ = tx.Rollback(b.ctx)
			t.Fatal("ClaimTx took a record over in an open transaction; a take-over must commit and return no transaction")
		}
		if err := b.complete(q, sampleResponse()); err != nil {
			t.Fatalf("Complete after a committed take-over: %v", err)
		}
		if err := b.complete(p, sampleResponse()); err == nil {
			t.Error("the old owner completed a record that was taken over")
		}
		b.mustOutcome(b.other(p), idemstore.ClaimCompleted)
	})

	t.Run("FencesGrow", func(t *testing.T) {
		b := setup(t, h)
		var last int64
		for range 3 {
			scope, key := b.names()
			p := b.claimParams(scope, key, fpA)
			r, tx := mustClaimTx(b, p, idemstore.ClaimAcquired)
			if r.Record.Fence <= last {
				t.Errorf("Fence %d after %d: fences of committed claims must grow", r.Record.Fence, last)
			}
			last = r.Record.Fence
			commit(b, tx, p, sampleResponse())
		}
		scope, key := b.names()
		if r := b.mustOutcome(b.claimParams(scope, key, fpA), idemstore.ClaimAcquired); r.Record.Fence <= last {
			t.Errorf("Claim's fence %d after ClaimTx's %d", r.Record.Fence, last)
		}
	})
}
