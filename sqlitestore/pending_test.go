package sqlitestore_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/sqlitestore"
)

// A ClaimTx claim writes its record only when its transaction needs it:
// what the transaction commits is the same as if ClaimTx had written the
// record at once.
func TestClaimTxPendingRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now()
	claim := func(t *testing.T, s interface {
		ClaimTx(context.Context, idemstore.ClaimParams) (idemstore.ClaimResult, idemstore.Tx, error)
	}, key, token string, at time.Time) (idemstore.ClaimParams, idemstore.ClaimResult, idemstore.Tx) {
		t.Helper()
		p := idemstore.ClaimParams{Scope: "s", Key: key, Fingerprint: "v1:x", Token: token, Lease: time.Second, TTL: time.Hour, Now: at}
		r, tx, err := s.ClaimTx(ctx, p)
		if err != nil || r.Outcome != idemstore.ClaimAcquired || tx == nil {
			t.Fatalf("ClaimTx: %v %v %v", r.Outcome, tx, err)
		}
		return p, r, tx
	}
	resp := &idemstore.Response{StatusCode: 201, Body: []byte("done")}

	t.Run("CommitWithoutComplete", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		p, _, tx := claim(t, s, "k", "a", now)
		// A renewal of the pending claim moves the lease it is written with.
		if err := tx.(idemstore.TxRenewer).Renew(ctx, idemstore.RenewParams{Scope: "s", Key: "k", Token: "a", Lease: 10 * time.Second, Now: now}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		q := p
		q.Token, q.Now = "b", now.Add(5*time.Second)
		if r, err := s.Claim(ctx, q); err != nil || r.Outcome != idemstore.ClaimInFlight {
			t.Fatalf("claim within the renewed lease: %v %v, want in flight", r.Outcome, err)
		}
		q.Now = now.Add(11 * time.Second)
		if r, err := s.Claim(ctx, q); err != nil || r.Outcome != idemstore.ClaimAcquired || !r.TookOver {
			t.Fatalf("claim after the lease: %+v %v, want a take-over", r, err)
		}
	})

	t.Run("NativeSeesTheRecord", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		p, _, tx := claim(t, s, "k", "a", now)
		sqlTx := tx.Native().(*sql.Tx)
		var state int
		if err := sqlTx.QueryRow(`SELECT state FROM idem_records WHERE scope = 's' AND key = 'k'`).Scan(&state); err != nil || state != 1 {
			t.Fatalf("the record through Native: state %d, %v; want in flight", state, err)
		}
		if err := s.CompleteTx(ctx, sqlTx, idemstore.CompleteParams{Scope: "s", Key: "k", Token: "a", Now: now, Response: resp}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		q := p
		q.Token = "b"
		if r, err := s.Claim(ctx, q); err != nil || r.Outcome != idemstore.ClaimCompleted || string(r.Record.Response.Body) != "done" {
			t.Fatalf("replay: %v %v", r.Outcome, err)
		}
	})

	t.Run("CompleteAfterExpiryIsLost", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		_, _, tx := claim(t, s, "k", "a", now)
		defer tx.Rollback(ctx)
		err := tx.Complete(ctx, idemstore.CompleteParams{Scope: "s", Key: "k", Token: "a", Now: now.Add(time.Hour), Response: resp})
		if err == nil {
			t.Fatal("Complete after the record's expiry succeeded")
		}
	})

	t.Run("ReplacesExpiredRecord", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		p, first, tx := claim(t, s, "k", "a", now)
		if err := tx.Complete(ctx, idemstore.CompleteParams{Scope: "s", Key: "k", Token: "a", Now: now, Response: resp}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		later := now.Add(2 * time.Hour)
		_, again, tx := claim(t, s, "k", "b", later)
		if again.Record.Fence <= first.Record.Fence {
			t.Errorf("fence after expiry %d, want > %d", again.Record.Fence, first.Record.Fence)
		}
		if err := tx.Complete(ctx, idemstore.CompleteParams{Scope: "s", Key: "k", Token: "b", Now: later, Response: &idemstore.Response{StatusCode: 200}}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		q := p
		q.Token, q.Now = "c", later
		if r, err := s.Claim(ctx, q); err != nil || r.Outcome != idemstore.ClaimCompleted || r.Record.Response.StatusCode != 200 {
			t.Fatalf("replay of the second execution: %v %v", r.Outcome, err)
		}
	})
}

// Fences grow for one key across a release, expiry and DeleteExpired.
func TestFenceGrowsAcrossDeleteExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := open(t)
	now := time.Now()
	p := idemstore.ClaimParams{Scope: "s", Key: "k", Fingerprint: "v1:x", Token: "a", Lease: time.Second, TTL: time.Minute, Now: now}
	var last int64
	step := func(what string) {
		t.Helper()
		r, err := s.Claim(ctx, p)
		if err != nil || r.Outcome != idemstore.ClaimAcquired {
			t.Fatalf("%s: %v %v", what, r.Outcome, err)
		}
		if r.Record.Fence <= last {
			t.Errorf("fence %s = %d, want > %d", what, r.Record.Fence, last)
		}
		last = r.Record.Fence
	}
	step("first")
	if err := s.Release(ctx, idemstore.ReleaseParams{Scope: "s", Key: "k", Token: p.Token, Now: p.Now}); err != nil {
		t.Fatal(err)
	}
	p.Token = "b"
	step("after release")
	p.Token, p.Now = "c", p.Now.Add(2*time.Minute)
	step("after expiry")
	p.Now = p.Now.Add(2 * time.Minute)
	if n, err := s.DeleteExpired(ctx, idemstore.DeleteExpiredParams{Now: p.Now, Limit: 10}); err != nil || n != 1 {
		t.Fatalf("DeleteExpired: %d %v", n, err)
	}
	p.Token = "d"
	step("after DeleteExpired")
}

// Fences come from blocks a Store reserves in the file's counter row once
// it draws fences alone. They still grow for one key when Stores on the
// file (processes) take turns, and never go below a fence handed out
// before, even by a claim that rolled back (which a later claim may get
// again, as the counter always allowed).
func TestFencesGrowAcrossStores(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a, path := open(t)
	b, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	now := time.Now()
	var committed, seen int64
	claim := func(s *sqlitestore.Store, key, token string, keep bool) {
		t.Helper()
		p := idemstore.ClaimParams{Scope: "s", Key: key, Fingerprint: "v1:x", Token: token, Lease: time.Second, TTL: time.Minute, Now: now}
		r, tx, err := s.ClaimTx(ctx, p)
		if err != nil || r.Outcome != idemstore.ClaimAcquired {
			t.Fatalf("claim %s: %v %v", token, r.Outcome, err)
		}
		if f := r.Record.Fence; f <= committed || f < seen {
			t.Errorf("claim %s: fence %d, want > %d (committed) and >= %d (handed out)", token, f, committed, seen)
		}
		seen = max(seen, r.Record.Fence)
		if !keep {
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			return
		}
		committed = r.Record.Fence
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.Release(ctx, idemstore.ReleaseParams{Scope: "s", Key: key, Token: token, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	for round := range 3 {
		// Alone long enough to reserve a block, with a rollback inside.
		for i := range 40 {
			claim(a, "k", fmt.Sprint("a", round, "-", i), i != 30)
		}
		for i, s := range []*sqlitestore.Store{b, a, b, b, a, b} {
			claim(s, "k", fmt.Sprint("x", round, "-", i), i%2 == 1)
		}
	}
}
