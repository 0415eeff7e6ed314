package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore"
)

// A duplicate that meets an uncommitted ClaimTx answers "in progress"
// after ClaimTxWait, not at its own (much later) deadline; the operation's
// statements in the claim's transaction run with the default lock_timeout.
func TestClaimTxDuplicateWaitsClaimTxWait(t *testing.T) {
	t.Parallel()
	eachMode(t, testClaimTxDuplicateWaitsClaimTxWait)
}

func testClaimTxDuplicateWaitsClaimTxWait(t *testing.T, mode string) {
	f := newFixtureIn(t, mode, &pgstore.Config{ClaimTxWait: 50 * time.Millisecond})
	p := claimParams("scope", "dup")
	r, tx, err := f.store.ClaimTx(t.Context(), p)
	if err != nil || r.Outcome != idemstore.ClaimAcquired || tx == nil {
		t.Fatalf("ClaimTx = %v, tx %v, %v; want acquired with a transaction", r.Outcome, tx != nil, err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var inTx, outside string
	if err := nativeQueryRow(t.Context(), tx.Native(), "SHOW lock_timeout").Scan(&inTx); err != nil {
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
	if dtx != nil || d.Outcome != idemstore.ClaimInFlight {
		t.Fatalf("duplicate ClaimTx = %v (tx %v), want in flight", d.Outcome, dtx != nil)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("the duplicate answered after %v; ClaimTxWait is 50ms", el)
	}
}

// Whichever statement ClaimTx's claim starts with, the transaction it
// returns runs the operation's statements with the session's lock_timeout,
// not ClaimTxWait: the INSERT of a new key (which restores it itself), the
// claim statement, and the INSERT that finds an expired record, which the
// claim statement then replaces in the same transaction.
func TestClaimTxRestoresLockTimeout(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, mode string) {
		for _, c := range []struct {
			name           string
			insert, expire bool
		}{
			{"insert", true, false},
			{"claim statement", false, false},
			{"insert meets an expired record", true, true},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				f := newFixtureIn(t, mode, &pgstore.Config{ClaimTxWait: 50 * time.Millisecond})
				pgstore.PinClaimStatement(f.store, c.insert)
				p := claimParams("scope", "lock-timeout")
				if c.expire {
					mustClaim(t, f.store, p, idemstore.ClaimAcquired)
					f.exec(t, "UPDATE "+f.table+" SET expires_at = statement_timestamp() - interval '1 second'")
					p.Token = newToken()
				}
				r, tx, err := f.store.ClaimTx(t.Context(), p)
				if err != nil || r.Outcome != idemstore.ClaimAcquired || tx == nil {
					t.Fatalf("ClaimTx = %v, tx %v, %v; want acquired with a transaction", r.Outcome, tx != nil, err)
				}
				defer func() { _ = tx.Rollback(context.Background()) }()
				if r.TookOver || r.Record.Fence == 0 || r.Record.Fingerprint != p.Fingerprint || !r.Record.LeaseExpiresAt.After(time.Now()) {
					t.Errorf("ClaimTx's record = %+v (took over %v), want a new in-flight record with a fence and a lease", r.Record, r.TookOver)
				}
				var inTx, outside string
				if err := nativeQueryRow(t.Context(), tx.Native(), "SHOW lock_timeout").Scan(&inTx); err != nil {
					t.Fatal(err)
				}
				if err := f.pool.QueryRow(t.Context(), "SHOW lock_timeout").Scan(&outside); err != nil {
					t.Fatal(err)
				}
				if inTx != outside {
					t.Errorf("lock_timeout in the claim's transaction = %q, want the session's %q", inTx, outside)
				}
			})
		}
	})
}

func TestClaimTxWaitValidated(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	if _, err := pgstore.New(t.Context(), f.pool, &pgstore.Config{Schema: f.schema, ClaimTxWait: time.Microsecond}); err == nil {
		t.Error("New accepted a ClaimTxWait under a millisecond")
	}
}

// ClaimTx's transactions return their connection to the pool when they end,
// committed with the completion in one round trip or rolled back, without
// closing it (a closed connection would cost a reconnect per request).
func TestClaimTxReusesConnections(t *testing.T) {
	t.Parallel()
	eachMode(t, testClaimTxReusesConnections)
}

func testClaimTxReusesConnections(t *testing.T, mode string) {
	f := newFixture(t, nil)
	var (
		s     *pgstore.Store
		check func()
	)
	if mode == modeSQL {
		db, err := openSQL(4)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if s, err = pgstore.NewDB(t.Context(), db, &pgstore.Config{Schema: f.schema}); err != nil {
			t.Fatal(err)
		}
		check = func() {
			if st := db.Stats(); st.InUse != 0 || st.OpenConnections > 4 {
				t.Errorf("%d connections in use, %d open after 40 sequential transactions; want 0 and at most 4", st.InUse, st.OpenConnections)
			}
		}
	} else {
		pool, err := openPool(4)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if s, err = pgstore.New(t.Context(), pool, &pgstore.Config{Schema: f.schema}); err != nil {
			t.Fatal(err)
		}
		check = func() {
			st := pool.Stat()
			if st.AcquiredConns() != 0 {
				t.Errorf("%d connections still acquired", st.AcquiredConns())
			}
			if n := st.NewConnsCount(); n > int64(st.MaxConns()) {
				t.Errorf("%d connections opened for 40 sequential transactions: they are closed instead of reused", n)
			}
		}
	}
	resp := &idemstore.Response{StatusCode: 201, Body: []byte(`{"ok":true}`)}
	for i := range 40 {
		p := claimParams("scope", fmt.Sprintf("reuse-%d", i))
		_, tx, err := s.ClaimTx(t.Context(), p)
		if err != nil || tx == nil {
			t.Fatalf("ClaimTx: %v (tx %v)", err, tx != nil)
		}
		if i%2 == 0 {
			if err := tx.Complete(t.Context(), idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: resp}); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(t.Context()); err != nil {
				t.Fatalf("Commit: %v", err)
			}
			mustClaim(t, s, claimParams("scope", p.Key), idemstore.ClaimCompleted)
		} else {
			if err := tx.Rollback(t.Context()); err != nil {
				t.Fatalf("Rollback: %v", err)
			}
		}
	}
	check()
}

// A completion deferred to Commit whose token does not own the record
// commits nothing and reports ErrLeaseLost.
func TestClaimTxCommitWithWrongTokenCommitsNothing(t *testing.T) {
	t.Parallel()
	eachMode(t, testClaimTxCommitWithWrongTokenCommitsNothing)
}

func testClaimTxCommitWithWrongTokenCommitsNothing(t *testing.T, mode string) {
	f := newFixtureIn(t, mode, nil)
	p := claimParams("scope", "wrong-token")
	_, tx, err := f.store.ClaimTx(t.Context(), p)
	if err != nil || tx == nil {
		t.Fatalf("ClaimTx: %v", err)
	}
	payments := businessTable(t, f)
	if err := nativeExec(t.Context(), tx.Native(), "INSERT INTO "+payments+" (idem_key, amount) VALUES ($1, 1)", p.Key); err != nil {
		t.Fatal(err)
	}
	err = tx.Complete(t.Context(), idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: "not-the-owner", Response: &idemstore.Response{StatusCode: 201}})
	if err == nil {
		err = tx.Commit(t.Context())
	}
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("Complete+Commit with a wrong token: %v, want ErrLeaseLost", err)
	}
	_ = tx.Rollback(t.Context())
	var n int
	if err := f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+payments).Scan(&n); err != nil || n != 0 {
		t.Fatalf("business rows after a refused commit: %d (%v), want 0", n, err)
	}
	mustClaim(t, f.store, claimParams("scope", p.Key), idemstore.ClaimAcquired)
}
