package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5"
)

// A duplicate that meets an uncommitted ClaimTx answers "in progress"
// after ClaimTxWait, not at its own (much later) deadline; the operation's
// statements in the claim's transaction run with the default lock_timeout.
func TestClaimTxDuplicateWaitsClaimTxWait(t *testing.T) {
	t.Parallel()
	f := newFixture(t, &pgstore.Config{ClaimTxWait: 50 * time.Millisecond})
	p := claimParams("scope", "dup")
	r, tx, err := f.store.ClaimTx(t.Context(), p)
	if err != nil || r.Outcome != idem.ClaimAcquired || tx == nil {
		t.Fatalf("ClaimTx = %v, tx %v, %v; want acquired with a transaction", r.Outcome, tx != nil, err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var inTx, outside string
	if err := tx.Native().(pgx.Tx).QueryRow(t.Context(), "SHOW lock_timeout").Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	if err := f.pool.QueryRow(t.Context(), "SHOW lock_timeout").Scan(&outside); err != nil {
		t.Fatal(err)
	}
	if inTx != outside {
		t.Errorf("lock_timeout in the claim's transaction = %q, want the session default %q", inTx, outside)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	start := time.Now()
	q := p
	q.Token = newToken()
	d, dtx, err := f.store.ClaimTx(ctx, q)
	if err != nil {
		t.Fatalf("duplicate ClaimTx: %v", err)
	}
	if dtx != nil || d.Outcome != idem.ClaimInFlight {
		t.Fatalf("duplicate ClaimTx = %v (tx %v), want in flight", d.Outcome, dtx != nil)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("the duplicate answered after %v; ClaimTxWait is 50ms", el)
	}
}

func TestClaimTxWaitValidated(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	if _, err := pgstore.New(t.Context(), f.pool, &pgstore.Config{Schema: f.schema, ClaimTxWait: time.Microsecond}); err == nil {
		t.Error("New accepted a ClaimTxWait under a millisecond")
	}
}
