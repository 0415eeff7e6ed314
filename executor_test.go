package idem_test

import (
	"context"
	"errors"
	"net/http"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
)

// journalTxStore is a TxStore over memstore whose transactions hold their
// completion back until Commit, and which journals what happened, so that
// the executor's use of transactions can be checked without a database.
// (sqlitestore and pgstore test the real thing.)
type journalTxStore struct {
	*memstore.Store
	mu      sync.Mutex
	journal []string
}

func (s *journalTxStore) log(e string) {
	s.mu.Lock()
	s.journal = append(s.journal, e)
	s.mu.Unlock()
}

func (s *journalTxStore) entries() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.journal...)
}

func (s *journalTxStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	s.log("store.complete")
	return s.Store.Complete(ctx, p)
}

func (s *journalTxStore) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	s.log("store.release")
	return s.Store.Release(ctx, p)
}

func (s *journalTxStore) BeginTx(ctx context.Context) (idemstore.Tx, error) {
	s.log("begin")
	return &journalTx{s: s}, nil
}

type journalTx struct {
	s       *journalTxStore
	pending *idemstore.CompleteParams
	done    bool
}

func (tx *journalTx) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	tx.s.log("tx.complete")
	tx.pending = &p
	return nil
}

func (tx *journalTx) Commit(ctx context.Context) error {
	tx.s.log("commit")
	tx.done = true
	if tx.pending != nil {
		return tx.s.Store.Complete(ctx, *tx.pending)
	}
	return nil
}

func (tx *journalTx) Rollback(ctx context.Context) error {
	if !tx.done {
		tx.s.log("rollback")
		tx.done = true
	}
	return nil
}

func (tx *journalTx) Native() any { return tx }

func newJournalStore(t *testing.T) *journalTxStore {
	m, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &journalTxStore{Store: m}
}

func doParams(key string) idem.DoParams {
	return idem.DoParams{Scope: idem.Scope("t", "op"), Key: key, Fingerprint: "v1:abc", Operation: "op"}
}

func TestExecutorTransaction(t *testing.T) {
	t.Parallel()
	s := newJournalStore(t)
	exec, err := idem.NewExecutor(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := idem.TxFromContext(ctx); !errors.Is(err, idem.ErrNoTx) {
		t.Fatalf("TxFromContext outside an execution: %v", err)
	}

	// An operation that asks for its transaction commits through it.
	var kept context.Context
	res, err := exec.Do(ctx, doParams("a"), func(ctx context.Context) (*idem.Response, error) {
		kept = ctx
		if s.entries() != nil {
			t.Errorf("transaction begun before it was asked for: %v", s.entries())
		}
		tx, err := idem.TxFromContext(ctx)
		if err != nil {
			return nil, err
		}
		if again, _ := idem.TxFromContext(ctx); again != tx {
			t.Error("a second TxFromContext returned another transaction")
		}
		return &idem.Response{StatusCode: 201, Body: []byte("ok")}, nil
	})
	if err != nil || res.Replayed {
		t.Fatalf("Do: %v", err)
	}
	if got := s.entries(); len(got) != 3 || got[0] != "begin" || got[1] != "tx.complete" || got[2] != "commit" {
		t.Fatalf("journal %v, want begin, tx.complete, commit", got)
	}
	if _, err := idem.TxFromContext(kept); err == nil {
		t.Error("TxFromContext works after the operation returned")
	}
	res, err = exec.Do(ctx, doParams("a"), func(context.Context) (*idem.Response, error) {
		t.Fatal("ran twice")
		return nil, nil
	})
	if err != nil || !res.Replayed || string(res.Response.Body) != "ok" {
		t.Fatalf("replay: %+v %v", res, err)
	}

	// An operation that does not ask for one completes without it.
	s.journal = nil
	if _, err := exec.Do(ctx, doParams("b"), func(context.Context) (*idem.Response, error) {
		return &idem.Response{StatusCode: 200}, nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := s.entries(); len(got) != 1 || got[0] != "store.complete" {
		t.Fatalf("journal %v, want only store.complete", got)
	}

	// A failing operation rolls back and releases.
	for name, op := range map[string]idem.Operation{
		"5xx": func(ctx context.Context) (*idem.Response, error) {
			idem.TxFromContext(ctx)
			return &idem.Response{StatusCode: 500}, nil
		},
		"error": func(ctx context.Context) (*idem.Response, error) {
			idem.TxFromContext(ctx)
			return nil, errors.New("boom")
		},
	} {
		s.journal = nil
		res, err := exec.Do(ctx, doParams("c-"+name), op)
		if name == "error" && (err == nil || err.Error() != "boom") {
			t.Errorf("%s: error %v, want the operation's own", name, err)
		}
		if name == "5xx" && (err != nil || !res.Released) {
			t.Errorf("%s: %+v %v, want released", name, res, err)
		}
		if got := s.entries(); len(got) != 3 || got[0] != "begin" || got[1] != "rollback" || got[2] != "store.release" {
			t.Errorf("%s: journal %v, want begin, rollback, store.release", name, got)
		}
	}
}

func TestExecutorPanicRollsBack(t *testing.T) {
	t.Parallel()
	s := newJournalStore(t)
	exec, _ := idem.NewExecutor(s, nil)
	func() {
		defer func() {
			if v := recover(); v != "kaboom" {
				t.Fatalf("recovered %v, want the operation's panic", v)
			}
		}()
		exec.Do(context.Background(), doParams("p"), func(ctx context.Context) (*idem.Response, error) {
			idem.TxFromContext(ctx)
			panic("kaboom")
		})
	}()
	if got := s.entries(); len(got) != 3 || got[1] != "rollback" || got[2] != "store.release" {
		t.Fatalf("journal %v", got)
	}
	ran := false
	if _, err := exec.Do(context.Background(), doParams("p"), func(context.Context) (*idem.Response, error) {
		ran = true
		return &idem.Response{StatusCode: 200}, nil
	}); err != nil || !ran {
		t.Fatalf("retry after a panic: ran=%v err=%v", ran, err)
	}
}

func TestExecutorOlderFingerprintVersion(t *testing.T) {
	t.Parallel()
	store, _ := memstore.New(nil)
	exec, _ := idem.NewExecutor(store, nil)
	ctx := context.Background()
	// A record written by an older release, under encoding "v0".
	old := doParams("k")
	old.Fingerprint = "v0:legacy"
	if _, err := exec.Do(ctx, old, func(context.Context) (*idem.Response, error) {
		return &idem.Response{StatusCode: 201, Body: []byte("from v0")}, nil
	}); err != nil {
		t.Fatal(err)
	}
	retry := doParams("k")
	retry.FingerprintAt = func(v string) (string, bool) {
		if v == "v0" {
			return "v0:legacy", true
		}
		return "", false
	}
	res, err := exec.Do(ctx, retry, func(context.Context) (*idem.Response, error) {
		t.Fatal("a retry from before the upgrade ran again")
		return nil, nil
	})
	if err != nil || !res.Replayed || string(res.Response.Body) != "from v0" {
		t.Fatalf("retry across a fingerprint version: %+v %v", res, err)
	}
	// A different request stays a mismatch in any version.
	other := doParams("k")
	other.FingerprintAt = func(string) (string, bool) { return "v0:different", true }
	if _, err := exec.Do(ctx, other, nil); !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("different request: %v", err)
	}
}

func TestNewExecutorValidatesConfig(t *testing.T) {
	t.Parallel()
	store, _ := memstore.New(nil)
	for name, cfg := range map[string]*idem.Config{
		"short lease":   {Lease: idem.MinLease / 2},
		"ttl < lease":   {Lease: idem.DefaultLease, TTL: idem.DefaultLease / 2},
		"negative wait": {Wait: -1},
		"bad mode":      {Requirement: 99},
		"negative body": {MaxRequestBody: -1},
		// The largest time.Duration: now+TTL would wrap into the past.
		"ttl overflow":   {TTL: 2562047*time.Hour + 47*time.Minute + 16*time.Second},
		"ttl > MaxTTL":   {TTL: idem.MaxTTL + time.Second},
		"lease > MaxTTL": {Lease: idem.MaxTTL + time.Second, TTL: idem.MaxTTL + time.Second},
		"store timeout":  {StoreTimeout: idem.MaxTTL + time.Second},
	} {
		if _, err := idem.NewMiddleware(store, cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := idem.NewExecutor(nil, nil); err == nil {
		t.Error("nil store accepted")
	}
	_, err := idem.NewExecutor(store, &idem.Config{TTL: 2562047 * time.Hour})
	if err == nil || !strings.Contains(err.Error(), "MaxTTL") {
		t.Errorf("huge TTL: %v, want an error naming MaxTTL", err)
	}
}

// The longest TTL Config accepts gives records that expire in the future,
// not a wrapped-around expiry that loses every lease at once.
func TestMaxTTLWorks(t *testing.T) {
	t.Parallel()
	store, _ := memstore.New(nil)
	exec, err := idem.NewExecutor(store, &idem.Config{TTL: idem.MaxTTL, Lease: idem.MaxTTL})
	if err != nil {
		t.Fatal(err)
	}
	res, err := exec.Do(context.Background(), doParams("k"), func(context.Context) (*idem.Response, error) {
		return &idem.Response{StatusCode: 201}, nil
	})
	if err != nil || !res.ExpiresAt.After(time.Now().Add(idem.MaxTTL-time.Hour)) {
		t.Fatalf("Do with MaxTTL: expires %v, err %v", res.ExpiresAt, err)
	}
}

func TestCompletionContextOutlivesTheClient(t *testing.T) {
	t.Parallel()
	store, _ := memstore.New(nil)
	var seen context.Context
	spy := &ctxSpy{Store: store, seen: &seen}
	exec, _ := idem.NewExecutor(spy, &idem.Config{StoreTimeout: time.Hour})
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxSpyKey{}, "v"))
	_, err := exec.Do(ctx, doParams("k"), func(context.Context) (*idem.Response, error) {
		cancel() // the client goes away while the operation runs
		return &idem.Response{StatusCode: 201}, nil
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if spy.err != nil {
		t.Fatalf("Complete saw a cancelled context: %v", spy.err)
	}
	if spy.value != "v" {
		t.Errorf("Complete's context lost the request's values: %v", spy.value)
	}
	// After the execution the context is over, and contexts derived from
	// it end with it.
	if seen.Err() == nil {
		t.Error("completion context still live after Do returned")
	}
	derived, stop := context.WithCancel(seen)
	defer stop()
	select {
	case <-derived.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a context derived from an ended completion context did not end")
	}
}

type ctxSpyKey struct{}

type ctxSpy struct {
	idemstore.Store
	seen  *context.Context
	err   error
	value any
}

func (s *ctxSpy) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	*s.seen = ctx
	s.err = ctx.Err()
	s.value = ctx.Value(ctxSpyKey{})
	return s.Store.Complete(ctx, p)
}

// panickingOperation is a named function so that its frame can be found in a
// stack trace.
func panickingOperation(context.Context) (*idem.Response, error) {
	panic("kaboom")
}

// A panic leaves Do with the operation's own frames on the stack (the key
// is released by a deferred function, not by recovering and panicking
// again), so that net/http's log of it points at the line that panicked.
func TestPanicKeepsTheOperationsStack(t *testing.T) {
	t.Parallel()
	store, _ := memstore.New(nil)
	exec, _ := idem.NewExecutor(store, nil)
	var stack string
	func() {
		defer func() {
			if v := recover(); v != "kaboom" {
				t.Fatalf("recovered %v, want the operation's panic", v)
			}
			stack = string(debug.Stack())
		}()
		exec.Do(context.Background(), doParams("p"), panickingOperation)
	}()
	if !strings.Contains(stack, "panickingOperation") {
		t.Fatalf("the panic's stack lost the operation's frame:\n%s", stack)
	}
	// And the key was released: a retry runs.
	if res, err := exec.Do(context.Background(), doParams("p"), func(context.Context) (*idem.Response, error) {
		return &idem.Response{StatusCode: 201}, nil
	}); err != nil || res.Replayed {
		t.Fatalf("retry after a panic: %+v %v", res, err)
	}
}

// NewExecutor refuses every field the Executor would ignore, naming it;
// NewMiddleware takes the same Config.
func TestNewExecutorRefusesMiddlewareOnlyFields(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]*idem.Config{
		"Requirement":        {Requirement: idem.KeyRequired},
		"RequiredMethods":    {RequiredMethods: []string{"PUT"}},
		"KeyHeader":          {KeyHeader: "Webhook-Id"},
		"ValidateKeyFunc":    {ValidateKeyFunc: func(string) error { return nil }},
		"TenantFunc":         {TenantFunc: func(*http.Request) (string, error) { return "", nil }},
		"OperationFunc":      {OperationFunc: func(*http.Request) string { return "" }},
		"FingerprintFunc":    {FingerprintFunc: func(*http.Request, []byte) ([]byte, error) { return nil, nil }},
		"FingerprintExclude": {FingerprintExclude: []string{"/a"}},
		"FingerprintInclude": {FingerprintInclude: []string{"/a"}},
		"MaxRequestBody":     {MaxRequestBody: 10},
		"MaxResponseBody":    {MaxResponseBody: 10},
		"ReplayDenyHeaders":  {ReplayDenyHeaders: []string{}},
		"FailOpen":           {FailOpen: true},
		"ProblemBaseURL":     {ProblemBaseURL: "https://example.com/#"},
		"ErrorFunc":          {ErrorFunc: func(http.ResponseWriter, *http.Request, *idem.Problem) {}},
	} {
		store := newMemStore(t)
		if _, err := idem.NewExecutor(store, cfg); err == nil || !strings.Contains(err.Error(), "Config."+name+" applies to the Middleware only") {
			t.Errorf("NewExecutor with %s: %v, want a refusal naming it", name, err)
		}
		if _, err := idem.NewMiddleware(store, cfg); err != nil {
			t.Errorf("NewMiddleware with %s: %v", name, err)
		}
	}
	if _, err := idem.NewExecutor(newMemStore(t), &idem.Config{Lease: time.Minute, Wait: time.Second}); err != nil {
		t.Errorf("NewExecutor with shared fields only: %v", err)
	}
}
