package storetest

import (
	"errors"
	"testing"

	"github.com/idemhq/idem/idemstore"
)

// testTx checks the transactional capability, if the store has it. The
// business side of the transaction is store-specific and is tested by each
// store; this checks the record side: completion inside a transaction is
// visible only after Commit, gone after Rollback, and fenced by the token.
func testTx(t *testing.T, h Harness) {
	probe := h.NewStore(t)
	if _, ok := probe.(idemstore.TxStore); !ok {
		t.Skip("the store does not implement idemstore.TxStore")
	}
	txStore := func(b *bundle) idemstore.TxStore { return b.store.(idemstore.TxStore) }
	completeParams := func(b *bundle, p idemstore.ClaimParams, resp *idemstore.Response) idemstore.CompleteParams {
		return idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: b.seal(p, resp), Now: b.clock.Now()}
	}

	t.Run("CommitCompletes", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		tx, err := txStore(b).BeginTx(b.ctx)
		if err != nil {
			t.Fatalf("BeginTx: %v", err)
		}
		want := sampleResponse()
		if err := tx.Complete(b.ctx, completeParams(b, p, want)); err != nil {
			t.Fatalf("tx Complete: %v", err)
		}
		if tx.Native() == nil {
			t.Error("Native() is nil")
		}
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		_ = tx.Rollback(b.ctx) // after Commit: a no-op
		r := b.mustOutcome(b.other(p), idemstore.ClaimCompleted)
		if d := sameResponse(r.Record.Response, want); d != "" {
			t.Errorf("response committed in a transaction: %s", d)
		}
	})

	t.Run("RollbackLeavesInFlight", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		tx, err := txStore(b).BeginTx(b.ctx)
		if err != nil {
			t.Fatalf("BeginTx: %v", err)
		}
		if err := tx.Complete(b.ctx, completeParams(b, p, sampleResponse())); err != nil {
			t.Fatalf("tx Complete: %v", err)
		}
		if err := tx.Rollback(b.ctx); err != nil {
			t.Fatalf("Rollback: %v", err)
		}
		b.mustOutcome(b.other(p), idemstore.ClaimInFlight)
		if err := b.release(p); err != nil {
			t.Fatalf("Release after a rolled-back completion: %v", err)
		}
	})

	t.Run("WrongTokenIsFenced", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		tx, err := txStore(b).BeginTx(b.ctx)
		if err != nil {
			t.Fatalf("BeginTx: %v", err)
		}
		err = tx.Complete(b.ctx, completeParams(b, b.other(p), sampleResponse()))
		_ = tx.Rollback(b.ctx)
		if !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("tx Complete with a wrong token: %v, want ErrLeaseLost", err)
		}
		b.mustOutcome(b.other(p), idemstore.ClaimInFlight)
	})

	t.Run("StaleOwnerIsFenced", func(t *testing.T) {
		b := setup(t, h)
		stale := b.acquire(fpA)
		b.clock.Advance(b.lease + b.lease/4)
		successor := b.other(stale)
		b.takeOver(successor)
		tx, err := txStore(b).BeginTx(b.ctx)
		if err != nil {
			t.Fatalf("BeginTx: %v", err)
		}
		err = tx.Complete(b.ctx, completeParams(b, stale, sampleResponse()))
		_ = tx.Rollback(b.ctx)
		if !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("stale tx Complete: %v, want ErrLeaseLost", err)
		}
		if err := b.complete(successor, sampleResponse()); err != nil {
			t.Fatalf("successor Complete: %v", err)
		}
	})

	t.Run("RenewInsideTx", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		tx, err := txStore(b).BeginTx(b.ctx)
		if err != nil {
			t.Fatalf("BeginTx: %v", err)
		}
		defer func() { _ = tx.Rollback(b.ctx) }()
		tr, ok := tx.(idemstore.TxRenewer)
		if !ok {
			t.Skip("the transaction does not implement idemstore.TxRenewer")
		}
		if err := tr.Renew(b.ctx, idemstore.RenewParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Lease: b.lease, Now: b.clock.Now()}); err != nil {
			t.Fatalf("tx Renew: %v", err)
		}
		if err := tr.Renew(b.ctx, idemstore.RenewParams{Scope: p.Scope, Key: p.Key, Token: "intruder", Lease: b.lease, Now: b.clock.Now()}); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("tx Renew with a wrong token: %v, want ErrLeaseLost", err)
		}
		if err := tx.Complete(b.ctx, completeParams(b, p, sampleResponse())); err != nil {
			t.Fatalf("tx Complete after a renewal: %v", err)
		}
		if err := tx.Commit(b.ctx); err != nil {
			t.Fatalf("Commit: %v", err)
		}
		b.mustOutcome(b.other(p), idemstore.ClaimCompleted)
	})
}
