package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
)

// txClaimStore is a TxClaimer over memstore that journals every call, so
// that the executor's use of Config.ClaimInTx can be checked without a
// database (sqlitestore and pgstore test the real thing, with storetest).
//
// It models a store with one writer, as SQLite is: ClaimTx of a new key
// takes the write lock, writes the in-flight record and returns with the
// lock held, so that no other claim (which needs the lock too) sees the
// record until the transaction ends. Commit applies the completion and
// frees the lock; Rollback deletes the record and frees the lock. A claim
// that cannot get the lock within busy answers ClaimInFlight. A take-over
// commits at once and returns no transaction, as the real stores do.
type txClaimStore struct {
	*memstore.Store
	writer chan struct{} // holds a token while the write lock is taken
	busy   time.Duration

	renewed   chan struct{} // closed at the first Renew
	renewOnce sync.Once
	busied    chan struct{} // signalled (without blocking) when a claim answers busy

	mu        sync.Mutex
	journal   []string
	txs       []*claimTxn       // the transactions ClaimTx returned
	claimCtxs []context.Context // the contexts ClaimTx was called with
	// hook, if set, answers ClaimTx instead of the store.
	hook        func(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, idemstore.Tx, error)
	completeErr error // returned once, by the next idemstore.Tx.Complete
	commitErr   error // returned once, by the next Commit, which then discards
}

var (
	_ idemstore.TxClaimer = (*txClaimStore)(nil)
	_ idemstore.StepStore = (*txClaimStore)(nil)
	_ idemstore.Watcher   = (*txClaimStore)(nil)
)

func newTxClaimStore(t *testing.T) *txClaimStore {
	t.Helper()
	m, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &txClaimStore{
		Store:   m,
		writer:  make(chan struct{}, 1),
		busy:    10 * time.Millisecond,
		renewed: make(chan struct{}),
		busied:  make(chan struct{}, 1),
	}
}

// newClaimInTxExecutor returns an Executor on s with Config.ClaimInTx and
// the other fields of cfg.
func newClaimInTxExecutor(t *testing.T, s idemstore.Store, cfg *idem.Config) *idem.Executor {
	t.Helper()
	c := idem.Config{}
	if cfg != nil {
		c = *cfg
	}
	c.ClaimInTx = true
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	e, err := idem.NewExecutor(s, &c)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func (s *txClaimStore) log(e string) {
	s.mu.Lock()
	s.journal = append(s.journal, e)
	s.mu.Unlock()
}

func (s *txClaimStore) entries() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.journal)
}

// transactions returns the transactions ClaimTx returned so far.
func (s *txClaimStore) transactions() []*claimTxn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.txs)
}

func (s *txClaimStore) claimContexts() []context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.claimCtxs)
}

func (s *txClaimStore) setHook(h func(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, idemstore.Tx, error)) {
	s.mu.Lock()
	s.hook = h
	s.mu.Unlock()
}

func (s *txClaimStore) failNextComplete(err error) {
	s.mu.Lock()
	s.completeErr = err
	s.mu.Unlock()
}

func (s *txClaimStore) failNextCommit(err error) {
	s.mu.Lock()
	s.commitErr = err
	s.mu.Unlock()
}

// takeErr returns *p and clears it.
func (s *txClaimStore) takeErr(p *error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	err := *p
	*p = nil
	return err
}

// openTx returns a transaction that holds no claim and no lock, for hooks
// that play a buggy or late store; it counts as returned by ClaimTx.
func (s *txClaimStore) openTx() *claimTxn {
	tx := &claimTxn{s: s, name: "tx"}
	s.mu.Lock()
	s.txs = append(s.txs, tx)
	s.mu.Unlock()
	return tx
}

// lock takes the write lock, waiting at most busy; it reports false if the
// lock stayed taken.
func (s *txClaimStore) lock(ctx context.Context) (bool, error) {
	select {
	case s.writer <- struct{}{}:
		return true, nil
	default:
	}
	t := time.NewTimer(s.busy)
	defer t.Stop()
	select {
	case s.writer <- struct{}{}:
		return true, nil
	case <-t.C:
		select {
		case s.busied <- struct{}{}:
		default:
		}
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

func (s *txClaimStore) unlock() { <-s.writer }

var busyAnswer = idemstore.ClaimResult{Outcome: idemstore.ClaimInFlight, Record: idemstore.Record{State: idemstore.StateInFlight}}

func (s *txClaimStore) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	s.log("store.claim")
	ok, err := s.lock(ctx)
	if err != nil || !ok {
		return busyAnswer, err
	}
	defer s.unlock()
	return s.Store.Claim(ctx, p)
}

func (s *txClaimStore) ClaimTx(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, idemstore.Tx, error) {
	s.log("claimtx")
	s.mu.Lock()
	s.claimCtxs = append(s.claimCtxs, ctx)
	hook := s.hook
	s.mu.Unlock()
	if hook != nil {
		return hook(ctx, p)
	}
	ok, err := s.lock(ctx)
	if err != nil || !ok {
		return busyAnswer, nil, err
	}
	r, err := s.Store.Claim(ctx, p)
	if err != nil || r.Outcome != idemstore.ClaimAcquired || r.TookOver {
		s.unlock()
		return r, nil, err
	}
	tx := &claimTxn{s: s, name: "tx", claim: &p, locked: true}
	s.mu.Lock()
	s.txs = append(s.txs, tx)
	s.mu.Unlock()
	return r, tx, nil
}

func (s *txClaimStore) Renew(ctx context.Context, p idemstore.RenewParams) error {
	s.log("store.renew")
	s.renewOnce.Do(func() { close(s.renewed) })
	return s.Store.Renew(ctx, p)
}

func (s *txClaimStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	s.log("store.complete")
	return s.Store.Complete(ctx, p)
}

func (s *txClaimStore) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	s.log("store.release")
	return s.Store.Release(ctx, p)
}

func (s *txClaimStore) BeginTx(ctx context.Context) (idemstore.Tx, error) {
	s.log("begin")
	return &claimTxn{s: s, name: "btx"}, nil
}

// claimTxn is a transaction of a txClaimStore: one ClaimTx returned ("tx",
// holding the uncommitted claim and the write lock) or one BeginTx began
// ("btx", holding nothing). Its completion is held back until Commit.
type claimTxn struct {
	s      *txClaimStore
	name   string
	claim  *idemstore.ClaimParams // the uncommitted claim, deleted by a rollback
	locked bool                   // holds the store's write lock

	mu      sync.Mutex
	pending *idemstore.CompleteParams
	ended   bool
}

var errTxEnded = errors.New("txClaimStore: the transaction has ended")

func (tx *claimTxn) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	tx.s.log(tx.name + ".complete")
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.ended {
		return errTxEnded
	}
	if err := tx.s.takeErr(&tx.s.completeErr); err != nil {
		return err
	}
	if tx.claim != nil && (p.Scope != tx.claim.Scope || p.Key != tx.claim.Key || p.Token != tx.claim.Token) {
		return idemstore.ErrLeaseLost
	}
	tx.pending = &p
	return nil
}

func (tx *claimTxn) Commit(ctx context.Context) error {
	tx.s.log(tx.name + ".commit")
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.ended {
		return errTxEnded
	}
	if err := tx.s.takeErr(&tx.s.commitErr); err != nil {
		// A failed commit ends the transaction with nothing committed, as
		// database/sql's and pgx's do.
		tx.finish(true)
		return err
	}
	var err error
	if tx.pending != nil {
		err = tx.s.Store.Complete(ctx, *tx.pending)
	}
	tx.finish(err != nil)
	return err
}

func (tx *claimTxn) Rollback(ctx context.Context) error {
	tx.s.log(tx.name + ".rollback")
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if !tx.ended {
		tx.finish(true)
	}
	return nil
}

// finish ends the transaction, discarding its claim if discard is set.
func (tx *claimTxn) finish(discard bool) {
	tx.ended = true
	if discard && tx.claim != nil {
		c := tx.claim
		_ = tx.s.Store.Release(context.Background(), idemstore.ReleaseParams{Scope: c.Scope, Key: c.Key, Token: c.Token, Now: c.Now})
	}
	if tx.locked {
		tx.s.unlock()
	}
}

func (tx *claimTxn) isEnded() bool {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	return tx.ended
}

func (tx *claimTxn) Native() any { return tx }

// wantJournal fails the test unless got is want.
func wantJournal(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s: journal %q, want %q", what, got, want)
	}
}

// without returns j without the entries e.
func without(j []string, e string) []string {
	return slices.DeleteFunc(slices.Clone(j), func(s string) bool { return s == e })
}

// created201 is an operation that stores a 201 and counts its runs.
func created201(runs *atomic.Int32, body string) idem.Operation {
	return func(context.Context) (*idem.Response, error) {
		runs.Add(1)
		return &idem.Response{StatusCode: 201, Body: []byte(body)}, nil
	}
}

// executesAgain checks that the key is free: a new Do with it runs its
// operation (no take-over, no replay) and completes in its claim's
// transaction.
func executesAgain(t *testing.T, exec *idem.Executor, s *txClaimStore, key string) {
	t.Helper()
	before := len(s.entries())
	var runs atomic.Int32
	res, err := exec.Do(context.Background(), doParams(key), created201(&runs, "again"))
	if err != nil || runs.Load() != 1 || res.Replayed || res.TookOver {
		t.Fatalf("the key is not free again: %+v %v, runs %d", res, err, runs.Load())
	}
	wantJournal(t, "the next execution", s.entries()[before:], "claimtx", "tx.complete", "tx.commit")
}

// ClaimInTx needs a TxClaimer: a plain store or a TxStore without ClaimTx
// is refused by NewExecutor and NewMiddleware, before any request.
func TestClaimInTxNeedsATxClaimer(t *testing.T) {
	t.Parallel()
	m, _ := memstore.New(nil)
	for name, store := range map[string]idemstore.Store{
		"memstore":   m,
		"TxStore":    newJournalStore(t),
		"plainStore": plainStore{newStallStore(t, "")},
	} {
		cfg := &idem.Config{ClaimInTx: true}
		if _, err := idem.NewExecutor(store, cfg); err == nil || !strings.Contains(err.Error(), "ClaimInTx") {
			t.Errorf("%s: NewExecutor: %v, want an error naming ClaimInTx", name, err)
		}
		if _, err := idem.NewMiddleware(store, cfg); err == nil || !strings.Contains(err.Error(), "ClaimInTx") {
			t.Errorf("%s: NewMiddleware: %v, want an error naming ClaimInTx", name, err)
		}
		// Without ClaimInTx the same store is accepted.
		if _, err := idem.NewExecutor(store, nil); err != nil {
			t.Errorf("%s without ClaimInTx: %v", name, err)
		}
	}
	s := newTxClaimStore(t)
	if _, err := idem.NewMiddleware(s, &idem.Config{ClaimInTx: true}); err != nil {
		t.Errorf("NewMiddleware on a TxClaimer: %v", err)
	}

	// Without ClaimInTx a TxClaimer is claimed with Claim, as any store.
	exec, err := idem.NewExecutor(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	if _, err := exec.Do(context.Background(), doParams("k"), created201(&runs, "x")); err != nil || runs.Load() != 1 {
		t.Fatalf("Do without ClaimInTx: %v, runs %d", err, runs.Load())
	}
	wantJournal(t, "without ClaimInTx", s.entries(), "store.claim", "store.complete")
}

// A first execution claims with ClaimTx and runs in the very transaction
// ClaimTx returned; the claim, the operation's writes and the response
// commit once, in that transaction, with no other store call. A retry
// replays.
func TestClaimInTxFirstExecutionCommitsOnce(t *testing.T) {
	t.Parallel()
	s := newTxClaimStore(t)
	kinds := &kindCounter{}
	exec := newClaimInTxExecutor(t, s, &idem.Config{Observer: kinds})
	ctx := context.Background()

	var runs atomic.Int32
	var kept context.Context
	res, err := exec.Do(ctx, doParams("a"), func(ctx context.Context) (*idem.Response, error) {
		runs.Add(1)
		kept = ctx
		wantJournal(t, "while the operation runs", s.entries(), "claimtx")
		tx, err := idem.TxFromContext(ctx)
		if err != nil {
			return nil, err
		}
		txs := s.transactions()
		if len(txs) != 1 || tx != idemstore.Tx(txs[0]) {
			t.Errorf("TxFromContext returned %v (%T), not the transaction ClaimTx returned (%v)", tx, tx, txs)
		}
		if again, _ := idem.TxFromContext(ctx); again != tx {
			t.Error("a second TxFromContext returned another transaction")
		}
		if info, ok := idem.InfoFromContext(ctx); !ok || info.TookOver || info.Fence <= 0 || info.Key != "a" {
			t.Errorf("InfoFromContext: %+v %v", info, ok)
		}
		return &idem.Response{StatusCode: 201, Body: []byte("ok")}, nil
	})
	if err != nil || res.Replayed || res.Released || res.TookOver || res.Response == nil || res.Response.StatusCode != 201 || res.ExpiresAt.IsZero() {
		t.Fatalf("first execution: %+v %v", res, err)
	}
	if runs.Load() != 1 {
		t.Fatalf("the operation ran %d times", runs.Load())
	}
	wantJournal(t, "first execution", s.entries(), "claimtx", "tx.complete", "tx.commit")
	if txs := s.transactions(); len(txs) != 1 || !txs[0].isEnded() {
		t.Errorf("the claim's transaction did not end: %v", txs)
	}
	if _, err := idem.TxFromContext(kept); err == nil {
		t.Error("TxFromContext works after the operation returned")
	}
	if n := kinds.get(idem.EventExecuted); n != 1 {
		t.Errorf("executed events: %d, want 1", n)
	}

	// The retry is answered by ClaimTx (completed, no transaction): a
	// replay, with no further store call.
	res, err = exec.Do(ctx, doParams("a"), func(context.Context) (*idem.Response, error) {
		t.Error("ran twice")
		return nil, nil
	})
	if err != nil || !res.Replayed || res.Response == nil || string(res.Response.Body) != "ok" {
		t.Fatalf("replay: %+v %v", res, err)
	}
	wantJournal(t, "replay", s.entries(), "claimtx", "tx.complete", "tx.commit", "claimtx")
	if n := len(s.transactions()); n != 1 {
		t.Errorf("ClaimTx returned %d transactions, want 1", n)
	}
	// The context ClaimTx answered the replay with has ended.
	if ctxs := s.claimContexts(); len(ctxs) != 2 || ctxs[1].Err() == nil {
		t.Errorf("the replay's claim context is still live (%d contexts)", len(ctxs))
	}

	// An operation that never asks for its transaction still completes in
	// it: the claim is there.
	if _, err := exec.Do(ctx, doParams("b"), created201(&runs, "b")); err != nil {
		t.Fatal(err)
	}
	wantJournal(t, "without TxFromContext", s.entries()[4:], "claimtx", "tx.complete", "tx.commit")
	if n := kinds.get(idem.EventReleased) + kinds.get(idem.EventStoreError) + kinds.get(idem.EventRenewed); n != 0 {
		t.Errorf("%d released, store error or renewed events, want none", n)
	}
}

// No lease renewal runs while the claim is uncommitted (nobody can take it
// over); the same operation without ClaimInTx does renew, which shows that
// the operation ran long enough for a renewal.
func TestClaimInTxRunsNoRenewer(t *testing.T) {
	t.Parallel()
	s := newTxClaimStore(t)
	exec := newClaimInTxExecutor(t, s, &idem.Config{Lease: idem.MinLease})
	if _, err := exec.Do(context.Background(), doParams("k"), func(ctx context.Context) (*idem.Response, error) {
		if _, err := idem.TxFromContext(ctx); err != nil {
			return nil, err
		}
		select {
		case <-s.renewed:
			t.Error("the lease of an uncommitted claim was renewed")
		case <-time.After(4 * idem.MinLease): // twelve renewal periods
		}
		return &idem.Response{StatusCode: 201}, nil
	}); err != nil {
		t.Fatal(err)
	}
	wantJournal(t, "ClaimInTx", s.entries(), "claimtx", "tx.complete", "tx.commit")

	// The control: the same store without ClaimInTx renews.
	plain, err := idem.NewExecutor(s, &idem.Config{Lease: idem.MinLease})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Do(context.Background(), doParams("other"), func(context.Context) (*idem.Response, error) {
		select {
		case <-s.renewed:
		case <-time.After(20 * time.Second):
			t.Error("no renewal without ClaimInTx either: the check above proves nothing")
		}
		return &idem.Response{StatusCode: 201}, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// An operation that fails, panics or answers 5xx releases its key by
// rolling its transaction back: the claim was in it, so nothing is left
// to Release, and the key is free for the next attempt.
func TestClaimInTxReleaseIsARollback(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	for _, tc := range []struct {
		name  string
		op    idem.Operation
		check func(t *testing.T, res *idem.Result, err error, panicked any)
	}{
		{"error", func(ctx context.Context) (*idem.Response, error) {
			if _, err := idem.TxFromContext(ctx); err != nil {
				return nil, err
			}
			return nil, boom
		}, func(t *testing.T, res *idem.Result, err error, _ any) {
			if err != boom || res.Response != nil {
				t.Errorf("%+v %v, want the operation's own error", res, err)
			}
		}},
		{"panic", func(ctx context.Context) (*idem.Response, error) {
			if _, err := idem.TxFromContext(ctx); err != nil {
				return nil, err
			}
			panic("kaboom")
		}, func(t *testing.T, _ *idem.Result, _ error, panicked any) {
			if panicked != "kaboom" {
				t.Errorf("recovered %v, want the operation's panic", panicked)
			}
		}},
		{"5xx", func(ctx context.Context) (*idem.Response, error) {
			if _, err := idem.TxFromContext(ctx); err != nil {
				return nil, err
			}
			return &idem.Response{StatusCode: 503}, nil
		}, func(t *testing.T, res *idem.Result, err error, _ any) {
			if err != nil || !res.Released || res.Response == nil || res.Response.StatusCode != 503 {
				t.Errorf("%+v %v, want the released 503", res, err)
			}
		}},
		{"5xx without TxFromContext", func(context.Context) (*idem.Response, error) {
			return &idem.Response{StatusCode: 500}, nil
		}, func(t *testing.T, res *idem.Result, err error, _ any) {
			if err != nil || !res.Released {
				t.Errorf("%+v %v, want released", res, err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newTxClaimStore(t)
			kinds := &kindCounter{}
			exec := newClaimInTxExecutor(t, s, &idem.Config{Observer: kinds})
			var (
				res      *idem.Result
				err      error
				panicked any
			)
			func() {
				defer func() { panicked = recover() }()
				res, err = exec.Do(context.Background(), doParams("k"), tc.op)
			}()
			tc.check(t, res, err, panicked)
			wantJournal(t, tc.name, s.entries(), "claimtx", "tx.rollback")
			if txs := s.transactions(); len(txs) != 1 || !txs[0].isEnded() {
				t.Errorf("the claim's transaction did not end: %v", txs)
			}
			if n := kinds.get(idem.EventReleased); n != 1 {
				t.Errorf("released events: %d, want 1", n)
			}
			executesAgain(t, exec, s, "k")
		})
	}
}

// Through the middleware: a 5xx and a panic roll the claim back (no
// Release), and the retry executes, commits once and then replays.
func TestClaimInTxMiddleware(t *testing.T) {
	t.Parallel()
	s := newTxClaimStore(t)
	var step atomic.Int32
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		tx, err := idem.TxFromContext(r.Context())
		if txs := s.transactions(); err != nil || len(txs) == 0 || tx != idemstore.Tx(txs[len(txs)-1]) {
			t.Errorf("the handler's transaction is %v (%v), not the claim's", tx, err)
		}
		switch step.Add(1) {
		case 1:
			http.Error(w, "transient", http.StatusInternalServerError)
		case 2:
			panic(http.ErrAbortHandler) // net/http closes the connection quietly
		default:
			created(w, r)
		}
	}, &options{store: s, cfg: &idem.Config{ClaimInTx: true}})

	if r := b.post(body1, "k"); r.status != 500 || r.header.Get(idem.HeaderExpiresAt) != "" {
		t.Fatalf("first: %d, Expires-At %q", r.status, r.header.Get(idem.HeaderExpiresAt))
	}
	wantJournal(t, "5xx", s.entries(), "claimtx", "tx.rollback")

	// A client of its own, whose transport does not send the request again
	// on the connection net/http closes (it would: the request carries an
	// Idempotency-Key, and a reused connection was closed).
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/things", strings.NewReader(body1))
	req.Header.Set("Idempotency-Key", "k")
	if resp, err := (&http.Client{Transport: tr}).Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the panic did not reach net/http: got %d", resp.StatusCode)
	}
	wantJournal(t, "panic", s.entries()[2:], "claimtx", "tx.rollback")

	r := b.post(body1, "k")
	if r.status != 201 || r.header.Get(idem.HeaderReplayed) != "false" || r.header.Get(idem.HeaderExpiresAt) == "" {
		t.Fatalf("third: %d replayed=%q", r.status, r.header.Get(idem.HeaderReplayed))
	}
	wantJournal(t, "third", s.entries()[4:], "claimtx", "tx.complete", "tx.commit")

	r2 := b.post(body1, "k")
	if r2.status != 201 || r2.header.Get(idem.HeaderReplayed) != "true" || string(r2.body) != string(r.body) {
		t.Fatalf("replay: %d replayed=%q body %s, want %s", r2.status, r2.header.Get(idem.HeaderReplayed), r2.body, r.body)
	}
	wantJournal(t, "replay", s.entries()[7:], "claimtx")
	if n := b.calls.Load(); n != 3 {
		t.Errorf("handler ran %d times, want 3", n)
	}
	if n := b.events.count(idem.EventReleased); n != 2 {
		t.Errorf("released events: %d, want 2", n)
	}
	if slices.Contains(s.entries(), "store.release") || slices.Contains(s.entries(), "store.claim") {
		t.Errorf("journal %q: Claim or Release called with ClaimInTx", s.entries())
	}
}

// When the commit (or the completion in the transaction) fails, nothing was
// committed, the claim included: Do fails with ErrStoreUnavailable (or
// ErrLeaseLost), Release is never called, and the key is free.
func TestClaimInTxCompletionFailure(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		fail    func(s *txClaimStore)
		wantErr error
		want    []string
	}{
		{"commit", func(s *txClaimStore) { s.failNextCommit(errors.New("disk I/O error")) }, idem.ErrStoreUnavailable,
			// The rollback after a failed commit does nothing, and is optional.
			[]string{"claimtx", "tx.complete", "tx.commit"}},
		{"complete", func(s *txClaimStore) { s.failNextComplete(errors.New("connection reset")) }, idem.ErrStoreUnavailable,
			[]string{"claimtx", "tx.complete", "tx.rollback"}},
		{"lease lost", func(s *txClaimStore) { s.failNextComplete(idemstore.ErrLeaseLost) }, idemstore.ErrLeaseLost,
			[]string{"claimtx", "tx.complete", "tx.rollback"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newTxClaimStore(t)
			exec := newClaimInTxExecutor(t, s, nil)
			tc.fail(s)
			var runs atomic.Int32
			res, err := exec.Do(context.Background(), doParams("k"), withTx(created201(&runs, "lost")))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Do: %+v %v, want %v", res, err, tc.wantErr)
			}
			if runs.Load() != 1 {
				t.Errorf("the operation ran %d times", runs.Load())
			}
			got := s.entries()
			if tc.name == "commit" && len(got) == 4 && got[3] == "tx.rollback" {
				got = got[:3]
			}
			wantJournal(t, tc.name, got, tc.want...)
			executesAgain(t, exec, s, "k")
		})
	}
}

// Through the middleware a failed commit is answered 503
// idempotency.store_unavailable, never with the handler's response, which
// was not recorded.
func TestClaimInTxCommitFailureAnswers503(t *testing.T) {
	t.Parallel()
	s := newTxClaimStore(t)
	s.failNextCommit(errors.New("disk I/O error"))
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		if _, err := idem.TxFromContext(r.Context()); err != nil {
			t.Error(err)
		}
		created(w, r)
	}, &options{store: s, cfg: &idem.Config{ClaimInTx: true}})
	r := b.post(body1, "k")
	if r.status != http.StatusServiceUnavailable || r.problemCode(t) != idem.CodeStoreUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("failed commit: %d %s", r.status, r.body)
	}
	if r := b.post(body1, "k"); r.status != 201 || r.header.Get(idem.HeaderReplayed) != "false" || b.calls.Load() != 2 {
		t.Fatalf("retry after a failed commit: %d, calls %d", r.status, b.calls.Load())
	}
	if slices.Contains(s.entries(), "store.release") {
		t.Errorf("journal %q: Release called", s.entries())
	}
}

// Step is refused while the claim is uncommitted: its recovery point would
// commit the claim, with no renewal running. The step's function does not
// run.
func TestClaimInTxRefusesSteps(t *testing.T) {
	t.Parallel()
	s := newTxClaimStore(t)
	exec := newClaimInTxExecutor(t, s, nil)
	stepErr := errors.New("step refused")
	_, err := exec.Do(context.Background(), doParams("k"), func(ctx context.Context) (*idem.Response, error) {
		for _, withTx := range []bool{false, true} {
			if withTx {
				if _, err := idem.TxFromContext(ctx); err != nil {
					return nil, err
				}
			}
			data, err := idem.Step(ctx, "charge", func(context.Context) ([]byte, error) {
				t.Error("the step ran in an uncommitted claim")
				return []byte("ch_1"), nil
			})
			if !errors.Is(err, idem.ErrStepsUnsupported) || data != nil {
				t.Errorf("Step (after TxFromContext: %v): %q %v, want ErrStepsUnsupported", withTx, data, err)
			}
		}
		if steps := idem.StepsFromContext(ctx); len(steps) != 0 {
			t.Errorf("steps recorded: %v", steps)
		}
		return nil, stepErr
	})
	if err != stepErr {
		t.Fatalf("Do: %v, want the operation's error", err)
	}
	wantJournal(t, "refused step", s.entries(), "claimtx", "tx.rollback")
	// No recovery point was saved: the key is free, not stuck.
	stuck, err := s.Stuck(context.Background(), idemstore.StuckParams{Limit: 10, Now: time.Now().Add(time.Hour)})
	if err != nil || len(stuck) != 0 {
		t.Fatalf("stuck records: %v %v", stuck, err)
	}
	executesAgain(t, exec, s, "k")
}

// A take-over (ClaimAcquired with TookOver and no transaction) runs as
// without ClaimInTx: the lease is renewed, the transaction is begun lazily
// with BeginTx, the record completes in it, and Step works.
func TestClaimInTxTakeOverRunsAsWithout(t *testing.T) {
	t.Parallel()
	s := newTxClaimStore(t)
	clock := newFakeClock()
	exec := newClaimInTxExecutor(t, s, &idem.Config{Lease: idem.MinLease, NowFunc: clock.Now})
	ctx := context.Background()
	p := doParams("k")
	// An owner that crashed: its lease runs out.
	if r, err := s.Store.Claim(ctx, idemstore.ClaimParams{Scope: p.Scope, Key: p.Key, Fingerprint: p.Fingerprint, Token: "crashed",
		Lease: idem.MinLease, TTL: time.Hour, Now: clock.Now()}); err != nil || r.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("seed claim: %+v %v", r, err)
	}
	clock.Advance(time.Second)

	var runs atomic.Int32
	res, err := exec.Do(ctx, p, func(ctx context.Context) (*idem.Response, error) {
		runs.Add(1)
		if info, ok := idem.InfoFromContext(ctx); !ok || !info.TookOver {
			t.Errorf("InfoFromContext: %+v, want TookOver", info)
		}
		select {
		case <-s.renewed:
		case <-time.After(20 * time.Second):
			t.Error("no lease renewal in a take-over execution")
		}
		data, err := idem.Step(ctx, "charge", func(context.Context) ([]byte, error) { return []byte("ch_1"), nil })
		if err != nil || string(data) != "ch_1" {
			t.Errorf("Step in a take-over execution: %q %v", data, err)
		}
		if slices.Contains(s.entries(), "begin") {
			t.Error("the transaction was begun before the operation asked for it")
		}
		tx, err := idem.TxFromContext(ctx)
		if err != nil {
			return nil, err
		}
		if bt, ok := tx.(*claimTxn); !ok || bt.name != "btx" {
			t.Errorf("the transaction is %#v, want one begun by BeginTx", tx)
		}
		return &idem.Response{StatusCode: 201, Body: []byte("took over")}, nil
	})
	if err != nil || !res.TookOver || res.Replayed || runs.Load() != 1 {
		t.Fatalf("take-over: %+v %v, runs %d", res, err, runs.Load())
	}
	got := s.entries()
	if !slices.Contains(got, "store.renew") {
		t.Errorf("journal %q: no renewal", got)
	}
	wantJournal(t, "take-over", without(got, "store.renew"), "claimtx", "begin", "btx.complete", "btx.commit")
	if n := len(s.transactions()); n != 0 {
		t.Errorf("ClaimTx returned %d transactions for a take-over", n)
	}

	res, err = exec.Do(ctx, p, func(context.Context) (*idem.Response, error) {
		t.Error("ran twice")
		return nil, nil
	})
	if err != nil || !res.Replayed || string(res.Response.Body) != "took over" {
		t.Fatalf("replay after the take-over: %+v %v", res, err)
	}
}

// A ClaimTx that stops answering is bounded by StoreTimeout like any store
// call: Do answers ErrStoreUnavailable and the operation never runs. A
// transaction that ClaimTx opens only after the deadline fired is rolled
// back, never used.
func TestClaimInTxStalledClaimTx(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	for _, tc := range []struct {
		name string
		// late answers after ctx ended.
		late func(s *txClaimStore, ctx context.Context) (idemstore.ClaimResult, idemstore.Tx, error)
		want []string
	}{
		{"blocks", func(_ *txClaimStore, ctx context.Context) (idemstore.ClaimResult, idemstore.Tx, error) {
			return idemstore.ClaimResult{}, nil, ctx.Err()
		}, []string{"claimtx"}},
		{"opens a transaction late", func(s *txClaimStore, ctx context.Context) (idemstore.ClaimResult, idemstore.Tx, error) {
			// The store ignored its context and acquired anyway.
			return idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: idemstore.Record{State: idemstore.StateInFlight,
				ExpiresAt: time.Now().Add(time.Hour), Fence: 1}}, s.openTx(), nil
		}, []string{"claimtx", "tx.rollback"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newTxClaimStore(t)
			stalled := make(chan struct{})
			s.setHook(func(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, idemstore.Tx, error) {
				close(stalled)
				<-ctx.Done()
				return tc.late(s, ctx)
			})
			exec := newClaimInTxExecutor(t, s, &idem.Config{StoreTimeout: timeout})
			var (
				res  *idem.Result
				err  error
				runs atomic.Int32
			)
			start := time.Now()
			done := make(chan struct{})
			go func() {
				defer close(done)
				res, err = exec.Do(context.Background(), doParams("k"), created201(&runs, "never"))
			}()
			<-stalled
			answerWithin(t, tc.name, done)
			elapsed := time.Since(start)
			if !errors.Is(err, idem.ErrStoreUnavailable) || res.Response != nil {
				t.Fatalf("Do: %+v %v, want ErrStoreUnavailable", res, err)
			}
			if elapsed < timeout || elapsed > 10*time.Second {
				t.Errorf("Do answered after %v, want about the StoreTimeout of %v", elapsed, timeout)
			}
			if runs.Load() != 0 {
				t.Error("the operation ran without a claim")
			}
			wantJournal(t, tc.name, s.entries(), tc.want...)
			for _, tx := range s.transactions() {
				if !tx.isEnded() {
					t.Error("the late transaction is still open")
				}
			}
			if ctxs := s.claimContexts(); len(ctxs) != 1 || ctxs[0].Err() == nil {
				t.Error("ClaimTx's context did not end at the timeout")
			}
		})
	}
}

// A buggy store that answers anything but ClaimAcquired with an open
// transaction: the transaction is rolled back, Do fails with
// ErrStoreUnavailable, and nothing runs or replays.
func TestClaimInTxOutcomeWithTransaction(t *testing.T) {
	t.Parallel()
	for _, o := range []idemstore.ClaimOutcome{idemstore.ClaimCompleted, idemstore.ClaimInFlight, idemstore.ClaimMismatch} {
		t.Run(o.String(), func(t *testing.T) {
			t.Parallel()
			s := newTxClaimStore(t)
			s.setHook(func(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, idemstore.Tx, error) {
				rec := idemstore.Record{State: idemstore.StateInFlight, Fingerprint: p.Fingerprint, ExpiresAt: time.Now().Add(time.Hour)}
				if o == idemstore.ClaimCompleted {
					rec.State, rec.Response = idemstore.StateCompleted, &idem.Response{StatusCode: 200, Body: []byte("stored")}
				}
				return idemstore.ClaimResult{Outcome: o, Record: rec}, s.openTx(), nil
			})
			exec := newClaimInTxExecutor(t, s, nil)
			var runs atomic.Int32
			res, err := exec.Do(context.Background(), doParams("k"), created201(&runs, "never"))
			if !errors.Is(err, idem.ErrStoreUnavailable) || res.Replayed || res.Response != nil {
				t.Fatalf("Do: %+v %v, want ErrStoreUnavailable", res, err)
			}
			if runs.Load() != 0 {
				t.Error("the operation ran")
			}
			wantJournal(t, o.String(), s.entries(), "claimtx", "tx.rollback")
			if txs := s.transactions(); len(txs) != 1 || !txs[0].isEnded() {
				t.Errorf("the transaction is still open: %v", txs)
			}
		})
	}
}

// The transaction's context is not the request's: a client that goes away
// while the operation runs does not end the transaction, whose claim and
// response still commit; the context ends once the transaction has.
func TestClaimInTxContextOutlivesTheRequest(t *testing.T) {
	t.Parallel()
	s := newTxClaimStore(t)
	exec := newClaimInTxExecutor(t, s, nil)
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxSpyKey{}, "v"))
	defer cancel()
	res, err := exec.Do(ctx, doParams("k"), func(opCtx context.Context) (*idem.Response, error) {
		cancel() // the client goes away
		if _, err := idem.TxFromContext(opCtx); err != nil {
			return nil, err
		}
		ctxs := s.claimContexts()
		if len(ctxs) != 1 {
			return nil, fmt.Errorf("%d claim contexts", len(ctxs))
		}
		if err := ctxs[0].Err(); err != nil {
			t.Errorf("the transaction's context ended with the request: %v", err)
		}
		if v := ctxs[0].Value(ctxSpyKey{}); v != "v" {
			t.Errorf("the transaction's context lost the request's values: %v", v)
		}
		return &idem.Response{StatusCode: 201, Body: []byte("done")}, nil
	})
	if err != nil || res.Response == nil || res.Response.StatusCode != 201 {
		t.Fatalf("Do: %+v %v", res, err)
	}
	wantJournal(t, "client gone", s.entries(), "claimtx", "tx.complete", "tx.commit")
	if ctxs := s.claimContexts(); ctxs[0].Err() == nil {
		t.Error("the transaction's context is still live after Do returned")
	}
	res, err = exec.Do(context.Background(), doParams("k"), nil)
	if err != nil || !res.Replayed || string(res.Response.Body) != "done" {
		t.Fatalf("replay: %+v %v", res, err)
	}
}

// A duplicate of an execution whose claim is uncommitted gets ErrInFlight
// (the store's busy answer); in wait mode it waits for the commit and
// replays. The operation runs once.
func TestClaimInTxDuplicates(t *testing.T) {
	t.Parallel()
	s := newTxClaimStore(t)
	exec := newClaimInTxExecutor(t, s, nil)
	waiting := newClaimInTxExecutor(t, s, &idem.Config{Wait: 30 * time.Second})
	ctx := context.Background()
	var runs atomic.Int32
	running, finish := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := exec.Do(ctx, doParams("k"), func(ctx context.Context) (*idem.Response, error) {
			runs.Add(1)
			close(running)
			<-finish
			return &idem.Response{StatusCode: 201, Body: []byte("first")}, nil
		})
		first <- err
	}()
	<-running

	if _, err := exec.Do(ctx, doParams("k"), created201(&runs, "dup")); !errors.Is(err, idemstore.ErrInFlight) {
		t.Errorf("duplicate: %v, want ErrInFlight", err)
	}
	<-s.busied // the duplicate's

	type outcome struct {
		res *idem.Result
		err error
	}
	waited := make(chan outcome, 1)
	go func() {
		res, err := waiting.Do(ctx, doParams("k"), created201(&runs, "dup"))
		waited <- outcome{res, err}
	}()
	<-s.busied // the waiting duplicate was told "in flight": it waits
	close(finish)
	if err := <-first; err != nil {
		t.Fatalf("first: %v", err)
	}
	w := <-waited
	if w.err != nil || !w.res.Replayed || !w.res.Waited || string(w.res.Response.Body) != "first" {
		t.Fatalf("waiting duplicate: %+v %v, want a replay after waiting", w.res, w.err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the operation ran %d times", n)
	}
	if n := len(s.transactions()); n != 1 {
		t.Errorf("ClaimTx returned %d transactions, want 1", n)
	}
}
