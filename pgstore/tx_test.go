package pgstore_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore"
)

// businessTable creates a table for the test's business rows in the
// fixture's schema and returns its quoted name.
func businessTable(t *testing.T, f *fixture) string {
	t.Helper()
	name := f.schema + ".payments"
	f.exec(t, "CREATE TABLE "+name+" (id bigserial PRIMARY KEY, idem_key text NOT NULL, amount integer NOT NULL)")
	return name
}

func TestCompleteTxCommitsWithBusinessRows(t *testing.T) {
	t.Parallel()
	eachMode(t, testCompleteTxCommitsWithBusinessRows)
}

func testCompleteTxCommitsWithBusinessRows(t *testing.T, mode string) {
	f := newFixtureIn(t, mode, nil)
	payments := businessTable(t, f)
	p := claimParams("scope", "pay-1")
	mustClaim(t, f.store, p, idemstore.ClaimAcquired)

	tx := f.begin(t)
	if err := tx.exec(t.Context(), "INSERT INTO "+payments+" (idem_key, amount) VALUES ($1, 100)", p.Key); err != nil {
		t.Fatal(err)
	}
	if err := tx.complete(t.Context(), completeParams(p, &idemstore.Response{StatusCode: 201, Body: []byte("paid")})); err != nil {
		t.Fatalf("CompleteTx: %v", err)
	}
	// Before the commit, others see neither the payment nor the response.
	if n := f.count(t, "SELECT count(*) FROM "+payments); n != 0 {
		t.Errorf("%d payments visible before commit", n)
	}
	mustClaim(t, f.store, claimParams("scope", "pay-1"), idemstore.ClaimInFlight)
	if err := tx.commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := f.count(t, "SELECT count(*) FROM "+payments+" WHERE idem_key = 'pay-1'"); n != 1 {
		t.Errorf("%d payments after commit, want 1", n)
	}
	r := mustClaim(t, f.store, claimParams("scope", "pay-1"), idemstore.ClaimCompleted)
	if string(r.Record.Response.Body) != "paid" {
		t.Errorf("replayed %q", r.Record.Response.Body)
	}
}

// A worker whose lease ran out and was taken over must not commit its
// business rows: CompleteTx says ErrLeaseLost, the caller rolls back.
func TestCompleteTxStaleTokenRollsBack(t *testing.T) {
	t.Parallel()
	eachMode(t, testCompleteTxStaleTokenRollsBack)
}

func testCompleteTxStaleTokenRollsBack(t *testing.T, mode string) {
	f := newFixtureIn(t, mode, nil)
	payments := businessTable(t, f)
	stale := claimParams("scope", "pay-1")
	mustClaim(t, f.store, stale, idemstore.ClaimAcquired)
	f.expireLease(t, stale.Scope, stale.Key)
	successor := claimParams("scope", "pay-1")
	if r := mustClaim(t, f.store, successor, idemstore.ClaimAcquired); !r.TookOver {
		t.Fatal("the successor's claim did not take over")
	}

	tx := f.begin(t)
	if err := tx.exec(t.Context(), "INSERT INTO "+payments+" (idem_key, amount) VALUES ($1, 100)", stale.Key); err != nil {
		t.Fatal(err)
	}
	err := tx.complete(t.Context(), completeParams(stale, &idemstore.Response{StatusCode: 201, Body: []byte("stale")}))
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("stale CompleteTx: %v, want ErrLeaseLost", err)
	}
	if err := tx.rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := f.count(t, "SELECT count(*) FROM "+payments); n != 0 {
		t.Errorf("%d payments after rollback, want 0", n)
	}
	// The successor still owns the record.
	if err := f.store.Complete(t.Context(), completeParams(successor, &idemstore.Response{StatusCode: 201, Body: []byte("successor")})); err != nil {
		t.Fatalf("successor Complete: %v", err)
	}
}

// A claim that would take over an expired lease while the owner's
// business transaction has already run CompleteTx waits for that
// transaction and then replays, instead of executing a second time.
func TestTakeOverWaitsForCompletingTransaction(t *testing.T) {
	t.Parallel()
	eachMode(t, testTakeOverWaitsForCompletingTransaction)
}

func testTakeOverWaitsForCompletingTransaction(t *testing.T, mode string) {
	f := newFixtureIn(t, mode, nil)
	p := claimParams("scope", "slow")
	mustClaim(t, f.store, p, idemstore.ClaimAcquired)
	f.expireLease(t, p.Scope, p.Key)
	tx := f.begin(t)
	var pid int
	if err := tx.queryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	// The lease has run out but nobody took the record over: the owner
	// still completes it.
	if err := tx.complete(t.Context(), completeParams(p, &idemstore.Response{StatusCode: 201, Body: []byte("done")})); err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   idemstore.ClaimResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := f.store.Claim(t.Context(), claimParams("scope", "slow"))
		done <- result{r, err}
	}()
	waitForBlocked(t, f, pid)
	if err := tx.commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	res := <-done
	if res.err != nil {
		t.Fatalf("Claim: %v", res.err)
	}
	if res.r.Outcome != idemstore.ClaimCompleted || string(res.r.Record.Response.Body) != "done" {
		t.Errorf("Claim after the owner's commit = %v %+v, want the completed response", res.r.Outcome, res.r.Record.Response)
	}
}

func TestTxOutsideExecution(t *testing.T) {
	t.Parallel()
	if _, err := pgstore.Tx(context.Background()); !errors.Is(err, idem.ErrNoTx) {
		t.Errorf("Tx outside an execution: %v, want ErrNoTx", err)
	}
	if _, err := pgstore.SQLTx(context.Background()); !errors.Is(err, idem.ErrNoTx) {
		t.Errorf("SQLTx outside an execution: %v, want ErrNoTx", err)
	}
}

// Tx answers in an execution of a Store made by New, SQLTx in one of a
// Store made by NewDB; each refuses the other's, naming the one to use.
func TestTxMatchesTheMode(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, mode string) {
		f := newFixtureIn(t, mode, nil)
		exec, err := idem.NewExecutor(f.store, nil)
		if err != nil {
			t.Fatal(err)
		}
		var right, wrong error
		_, err = exec.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k", Fingerprint: "v1:x"}, func(ctx context.Context) (*idemstore.Response, error) {
			if mode == modeSQL {
				_, right = pgstore.SQLTx(ctx)
				_, wrong = pgstore.Tx(ctx)
			} else {
				_, right = pgstore.Tx(ctx)
				_, wrong = pgstore.SQLTx(ctx)
			}
			return &idemstore.Response{StatusCode: 200}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if right != nil {
			t.Errorf("the mode's own accessor: %v", right)
		}
		if wrong == nil || errors.Is(wrong, idem.ErrNoTx) {
			t.Errorf("the other mode's accessor: %v, want an error naming the right one", wrong)
		}
	})
}

// Through the middleware: the handler's business row and the stored
// response commit together on 201; on 500 the row rolls back and the key is
// released, so a retry runs the handler again.
func TestMiddlewareTransaction(t *testing.T) {
	t.Parallel()
	eachMode(t, testMiddlewareTransaction)
}

func testMiddlewareTransaction(t *testing.T, mode string) {
	f := newFixtureIn(t, mode, nil)
	payments := businessTable(t, f)
	mw, err := idem.NewMiddleware(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	var fail atomic.Bool
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		info, _ := idem.InfoFromContext(r.Context())
		if err := execTx(r.Context(), "INSERT INTO "+payments+" (idem_key, amount) VALUES ($1, 100)", info.Key); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if fail.Load() {
			http.Error(w, "downstream failed", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"pay_1"}`)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	post := func(key string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get(idem.HeaderReplayed), string(b)
	}
	paymentsFor := func(key string) int {
		return f.count(t, "SELECT count(*) FROM "+payments+" WHERE idem_key = $1", key)
	}

	if code, replayed, body := post("ok-1"); code != 201 || replayed != "false" {
		t.Fatalf("first request: %d replayed=%s %s", code, replayed, body)
	}
	if n := paymentsFor("ok-1"); n != 1 {
		t.Errorf("%d payments after 201, want 1", n)
	}
	if code, replayed, body := post("ok-1"); code != 201 || replayed != "true" || body != `{"id":"pay_1"}` {
		t.Errorf("retry: %d replayed=%s %s", code, replayed, body)
	}
	if calls.Load() != 1 || paymentsFor("ok-1") != 1 {
		t.Errorf("after a replay: %d handler calls, %d payments; want 1 and 1", calls.Load(), paymentsFor("ok-1"))
	}

	fail.Store(true)
	if code, _, _ := post("fail-1"); code != 500 {
		t.Fatalf("failing request: %d, want 500", code)
	}
	if n := paymentsFor("fail-1"); n != 0 {
		t.Errorf("%d payments after a 500, want 0 (rolled back)", n)
	}
	if n := f.count(t, "SELECT count(*) FROM "+f.table+" WHERE key = 'fail-1'"); n != 0 {
		t.Errorf("the record of a 500 was kept; want it released")
	}
	fail.Store(false)
	if code, replayed, _ := post("fail-1"); code != 201 || replayed != "false" {
		t.Errorf("retry after a 500: %d replayed=%s, want a fresh 201", code, replayed)
	}
	if n := paymentsFor("fail-1"); n != 1 {
		t.Errorf("%d payments after the successful retry, want 1", n)
	}
	if calls.Load() != 3 {
		t.Errorf("%d handler calls, want 3", calls.Load())
	}
}

// Claim's first INSERT has no guard against a record another transaction
// holds: a duplicate that meets CompleteTx's open transaction waits for it
// at most the statement's lock_timeout, then the guarded statement answers
// from the committed record, long before the transaction ends. The
// lock_timeout does not outlive the statement on the connection.
func TestClaimDoesNotWaitForAnOpenCompletion(t *testing.T) {
	t.Parallel()
	pool, err := openPool(1)
	if err != nil {
		unreachable(t, err)
	}
	t.Cleanup(pool.Close)
	s, err := pgstore.New(t.Context(), pool, &pgstore.Config{Schema: freshSchema(t, pool)})
	if err != nil {
		t.Fatal(err)
	}
	pgstore.PinClaimStatement(s, true)
	p := claimParams("scope", "pay-1")
	mustClaim(t, s, p, idemstore.ClaimAcquired)

	// The business transaction runs on a connection of the shared pool:
	// the store's pool has one, for the claims.
	tx, err := sharedPool(t).Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(t.Context()))
	if err := s.CompleteTx(t.Context(), tx, completeParams(p, &idemstore.Response{StatusCode: 201, Body: []byte("paid")})); err != nil {
		t.Fatalf("CompleteTx: %v", err)
	}
	// Waiting for the open transaction would run into this deadline.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	dup := claimParams("scope", "pay-1")
	r, err := s.Claim(ctx, dup)
	if err != nil {
		t.Fatalf("Claim of a key whose completion is not committed yet: %v", err)
	}
	if r.Outcome != idemstore.ClaimInFlight {
		t.Fatalf("Claim = %v, want ClaimInFlight", r.Outcome)
	}
	var lockTimeout string
	if err := pool.QueryRow(t.Context(), "SHOW lock_timeout").Scan(&lockTimeout); err != nil {
		t.Fatal(err)
	}
	if lockTimeout != "0" {
		t.Errorf("lock_timeout on the store's connection after a claim = %q, want the default 0", lockTimeout)
	}
	if err := tx.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, claimParams("scope", "pay-1"), idemstore.ClaimCompleted)
}
