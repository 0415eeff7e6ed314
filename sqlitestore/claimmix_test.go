package sqlitestore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/storetest"
)

// ClaimTx answers every kind of claim the same whether it reads first (as
// after duplicates) or goes straight to the write lock (as while claims
// are of new keys): a new key, a replay, a mismatch, a claim in flight and
// a take-over.
func TestClaimTxAnswersAlikeBothWays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, readFirst := range []bool{false, true} {
		name := map[bool]string{false: "WriteLockFirst", true: "ReadFirst"}[readFirst]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, _ := open(t)
			now := time.Now()
			claim := func(key, fp, token string, at time.Time) (idemstore.ClaimResult, idemstore.Tx) {
				t.Helper()
				if readFirst {
					s.PreferReads()
				}
				if got := s.ReadsFirst(); got != readFirst {
					t.Fatalf("reads first: %v, want %v", got, readFirst)
				}
				r, tx, err := s.ClaimTx(ctx, idemstore.ClaimParams{Scope: "s", Key: key, Fingerprint: fp, Token: token, Lease: time.Second, TTL: time.Hour, Now: at})
				if err != nil {
					t.Fatalf("ClaimTx %s: %v", key, err)
				}
				return r, tx
			}
			r, tx := claim("done", "v1:a", "t1", now)
			if r.Outcome != idemstore.ClaimAcquired || tx == nil {
				t.Fatalf("new key: %v, tx %v", r.Outcome, tx)
			}
			resp := &idemstore.Response{StatusCode: 201, Body: []byte("paid")}
			if err := tx.Complete(ctx, idemstore.CompleteParams{Scope: "s", Key: "done", Token: "t1", Response: resp, Now: now}); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			if r, tx := claim("done", "v1:a", "t2", now); r.Outcome != idemstore.ClaimCompleted || tx != nil || r.Record.Response == nil || string(r.Record.Response.Body) != "paid" {
				t.Fatalf("replay: %+v, tx %v", r, tx)
			}
			if r, tx := claim("done", "v1:b", "t3", now); r.Outcome != idemstore.ClaimMismatch || tx != nil {
				t.Fatalf("other payload: %v, tx %v", r.Outcome, tx)
			}
			// A record in flight, committed by Claim.
			if r, err := s.Claim(ctx, idemstore.ClaimParams{Scope: "s", Key: "running", Fingerprint: "v1:a", Token: "t4", Lease: time.Second, TTL: time.Hour, Now: now}); err != nil || r.Outcome != idemstore.ClaimAcquired {
				t.Fatalf("Claim: %v %v", r.Outcome, err)
			}
			if r, tx := claim("running", "v1:a", "t5", now); r.Outcome != idemstore.ClaimInFlight || tx != nil {
				t.Fatalf("in flight: %v, tx %v", r.Outcome, tx)
			}
			if r, tx := claim("running", "v1:a", "t6", now.Add(2*time.Second)); r.Outcome != idemstore.ClaimAcquired || !r.TookOver || tx != nil {
				t.Fatalf("after the lease: %+v, tx %v, want a take-over committed on its own", r, tx)
			}
			if err := s.Renew(ctx, idemstore.RenewParams{Scope: "s", Key: "running", Token: "t6", Lease: time.Second, Now: now.Add(2 * time.Second)}); err != nil {
				t.Fatalf("the taker's token does not own the record: %v", err)
			}
		})
	}
}

// While ClaimTx meets new keys it does not use the read-only pool; after
// a run of duplicates it does, and a run of new keys turns it back. The
// reader is closed so that a read shows as an error.
func TestClaimTxReadsFirstAfterDuplicates(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := time.Now()
	p := func(key string) idemstore.ClaimParams {
		return idemstore.ClaimParams{Scope: "s", Key: key, Fingerprint: "v1:a", Token: key, Lease: time.Hour, TTL: time.Hour, Now: now}
	}
	t.Run("Duplicates", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		r, tx, err := s.ClaimTx(ctx, p("k"))
		if err != nil || tx == nil {
			t.Fatalf("ClaimTx: %v %v", r.Outcome, err)
		}
		if err := tx.Commit(ctx); err != nil { // the record, in flight
			t.Fatal(err)
		}
		if err := s.ReadDB().Close(); err != nil {
			t.Fatal(err)
		}
		n := 0
		for ; !s.ReadsFirst(); n++ {
			if n > 64 {
				t.Fatal("still not reading first after 64 duplicates")
			}
			r, tx, err := s.ClaimTx(ctx, p("k"))
			if err != nil || r.Outcome != idemstore.ClaimInFlight || tx != nil {
				t.Fatalf("duplicate %d, under the write lock: %v, tx %v, %v", n, r.Outcome, tx, err)
			}
		}
		if n < 8 {
			t.Errorf("reads first after %d duplicates", n)
		}
		if _, _, err := s.ClaimTx(ctx, p("k")); err == nil {
			t.Fatal("a claim after the duplicates did not read from the (closed) read-only pool")
		}
	})
	t.Run("NewKeys", func(t *testing.T) {
		t.Parallel()
		s, _ := open(t)
		s.PreferReads()
		n := 0
		for ; s.ReadsFirst(); n++ {
			if n > 64 {
				t.Fatal("still reading first after 64 new keys")
			}
			r, tx, err := s.ClaimTx(ctx, p(fmt.Sprint("new-", n)))
			if err != nil || r.Outcome != idemstore.ClaimAcquired || tx == nil {
				t.Fatalf("new key %d: %v %v", n, r.Outcome, err)
			}
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if n < 8 {
			t.Errorf("goes to the write lock first after %d new keys", n)
		}
		if err := s.ReadDB().Close(); err != nil {
			t.Fatal(err)
		}
		r, tx, err := s.ClaimTx(ctx, p("last"))
		if err != nil || r.Outcome != idemstore.ClaimAcquired || tx == nil {
			t.Fatalf("new key without the read-only pool: %v %v", r.Outcome, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// The conformance suite with ClaimTx reading first, as after a run of
// duplicates (TestConformance's fresh stores go to the write lock first).
func TestConformanceReadFirst(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		NewStore: func(t *testing.T) idemstore.Store {
			s, _ := open(t)
			s.PreferReads()
			return s
		},
		DeferredTakeOver: true,
	})
}
