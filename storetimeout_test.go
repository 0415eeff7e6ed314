package idem_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
)

// stallStore is a TxStore over memstore whose method named by stall stops
// answering, as a database behind a frozen connection does: the call
// returns only when its context ends, with the context's error. Every other
// call goes through. Transactions hold their completion back until Commit.
type stallStore struct {
	*memstore.Store
	stall   string
	stalled chan struct{} // closed when the stalled method is first called
	once    sync.Once
}

func newStallStore(t *testing.T, stall string) *stallStore {
	m, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &stallStore{Store: m, stall: stall, stalled: make(chan struct{})}
}

// hang stalls until ctx ends if name is the stalled method.
func (s *stallStore) hang(ctx context.Context, name string) error {
	if name != s.stall {
		return nil
	}
	s.once.Do(func() { close(s.stalled) })
	<-ctx.Done()
	return ctx.Err()
}

func (s *stallStore) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	if err := s.hang(ctx, "Claim"); err != nil {
		return idemstore.ClaimResult{}, err
	}
	return s.Store.Claim(ctx, p)
}

func (s *stallStore) Renew(ctx context.Context, p idemstore.RenewParams) error {
	if err := s.hang(ctx, "Renew"); err != nil {
		return err
	}
	return s.Store.Renew(ctx, p)
}

func (s *stallStore) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if err := s.hang(ctx, "Complete"); err != nil {
		return err
	}
	return s.Store.Complete(ctx, p)
}

func (s *stallStore) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	if err := s.hang(ctx, "Release"); err != nil {
		return err
	}
	return s.Store.Release(ctx, p)
}

func (s *stallStore) Watch(ctx context.Context, scope, key string) (<-chan struct{}, error) {
	if err := s.hang(ctx, "Watch"); err != nil {
		return nil, err
	}
	return s.Store.Watch(ctx, scope, key)
}

func (s *stallStore) BeginTx(ctx context.Context) (idemstore.Tx, error) {
	if err := s.hang(ctx, "BeginTx"); err != nil {
		return nil, err
	}
	return &stallTx{s: s}, nil
}

type stallTx struct {
	s       *stallStore
	pending *idemstore.CompleteParams
}

func (tx *stallTx) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	if err := tx.s.hang(ctx, "tx.Complete"); err != nil {
		return err
	}
	tx.pending = &p
	return nil
}

func (tx *stallTx) Commit(ctx context.Context) error {
	if err := tx.s.hang(ctx, "tx.Commit"); err != nil {
		return err
	}
	if tx.pending != nil {
		return tx.s.Store.Complete(ctx, *tx.pending)
	}
	return nil
}

func (tx *stallTx) Rollback(context.Context) error { return nil }
func (tx *stallTx) Native() any                    { return tx }

// answerWithin waits for done, failing the test if it takes longer than a
// bound far above the store timeout: without a timeout of its own, a stalled
// store call never returns.
func answerWithin(t *testing.T, what string, done <-chan struct{}) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no answer 30 s after the store stopped answering (StoreTimeout is 100 ms)", what)
	}
}

// A store that stops answering must never hang a request: every store call
// is bounded by StoreTimeout (issue 11, item 1).
func TestStalledStoreCallsAreBounded(t *testing.T) {
	t.Parallel()
	ok := func(context.Context) (*idem.Response, error) { return &idem.Response{StatusCode: 201}, nil }
	for _, tc := range []struct {
		stall string
		tx    bool
		op    idem.Operation
		check func(t *testing.T, res *idem.Result, err error)
	}{
		{stall: "Claim", op: ok, check: func(t *testing.T, _ *idem.Result, err error) {
			if !errors.Is(err, idem.ErrStoreUnavailable) {
				t.Errorf("err %v, want ErrStoreUnavailable", err)
			}
		}},
		{stall: "Complete", op: ok, check: func(t *testing.T, res *idem.Result, err error) {
			// The operation ran: its response goes out unstored.
			if err != nil || res.Response == nil || res.Response.StatusCode != 201 {
				t.Errorf("res %+v err %v, want the operation's response", res, err)
			}
		}},
		{stall: "Release", op: func(context.Context) (*idem.Response, error) {
			return &idem.Response{StatusCode: 500}, nil
		}, check: func(t *testing.T, res *idem.Result, err error) {
			if err != nil || !res.Released {
				t.Errorf("res %+v err %v, want the released response", res, err)
			}
		}},
		{stall: "Renew", op: func(ctx context.Context) (*idem.Response, error) {
			<-ctx.Done() // the lease runs out while renewals stall
			if cause := context.Cause(ctx); !errors.Is(cause, idemstore.ErrLeaseLost) {
				return nil, cause
			}
			return nil, ctx.Err()
		}, check: func(t *testing.T, _ *idem.Result, err error) {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("err %v, want the operation's cancellation after the lease ran out", err)
			}
		}},
		{stall: "BeginTx", tx: true, op: func(ctx context.Context) (*idem.Response, error) {
			_, err := idem.TxFromContext(ctx)
			return nil, err
		}, check: func(t *testing.T, _ *idem.Result, err error) {
			if !errors.Is(err, idem.ErrStoreUnavailable) {
				t.Errorf("err %v, want ErrStoreUnavailable from TxFromContext", err)
			}
		}},
		{stall: "tx.Complete", tx: true, op: withTx(ok), check: func(t *testing.T, _ *idem.Result, err error) {
			if !errors.Is(err, idem.ErrStoreUnavailable) {
				t.Errorf("err %v, want ErrStoreUnavailable", err)
			}
		}},
		{stall: "tx.Commit", tx: true, op: withTx(ok), check: func(t *testing.T, _ *idem.Result, err error) {
			if !errors.Is(err, idem.ErrStoreUnavailable) {
				t.Errorf("err %v, want ErrStoreUnavailable", err)
			}
		}},
	} {
		t.Run(tc.stall, func(t *testing.T) {
			t.Parallel()
			s := newStallStore(t, tc.stall)
			var store idemstore.Store = s
			if !tc.tx {
				store = plainStore{s} // hides BeginTx
			}
			exec, err := idem.NewExecutor(store, &idem.Config{
				StoreTimeout: 100 * time.Millisecond,
				Lease:        150 * time.Millisecond,
				Logger:       slog.New(slog.DiscardHandler),
			})
			if err != nil {
				t.Fatal(err)
			}
			var res *idem.Result
			done := make(chan struct{})
			go func() {
				defer close(done)
				res, err = exec.Do(context.Background(), doParams("k"), tc.op)
			}()
			answerWithin(t, tc.stall, done)
			select {
			case <-s.stalled:
			default:
				t.Fatalf("%s was never called", tc.stall)
			}
			tc.check(t, res, err)
		})
	}
}

// withTx makes op write through its transaction first.
func withTx(op idem.Operation) idem.Operation {
	return func(ctx context.Context) (*idem.Response, error) {
		if _, err := idem.TxFromContext(ctx); err != nil {
			return nil, err
		}
		return op(ctx)
	}
}

// plainStore shows only the Store and Watcher methods of a stallStore.
type plainStore struct{ s *stallStore }

func (p plainStore) Claim(ctx context.Context, c idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	return p.s.Claim(ctx, c)
}
func (p plainStore) Renew(ctx context.Context, r idemstore.RenewParams) error {
	return p.s.Renew(ctx, r)
}
func (p plainStore) Complete(ctx context.Context, c idemstore.CompleteParams) error {
	return p.s.Complete(ctx, c)
}
func (p plainStore) Release(ctx context.Context, r idemstore.ReleaseParams) error {
	return p.s.Release(ctx, r)
}
func (p plainStore) DeleteExpired(ctx context.Context, d idemstore.DeleteExpiredParams) (int, error) {
	return p.s.DeleteExpired(ctx, d)
}
func (p plainStore) Watch(ctx context.Context, scope, key string) (<-chan struct{}, error) {
	return p.s.Watch(ctx, scope, key)
}

// Through the middleware a stalled claim is answered 503
// idempotency.store_unavailable with Retry-After, and the handler never
// runs.
func TestStalledClaimAnswers503(t *testing.T) {
	t.Parallel()
	s := newStallStore(t, "Claim")
	b := setup(t, created, &options{store: plainStore{s}, cfg: &idem.Config{StoreTimeout: 100 * time.Millisecond}})
	var r result
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+"/things", strings.NewReader(body1))
		req.Header.Set("Idempotency-Key", "k")
		resp, err := b.srv.Client().Do(req)
		if err != nil {
			return
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		r = result{resp.StatusCode, resp.Header, data}
	}()
	answerWithin(t, "claim", done)
	if r.status != http.StatusServiceUnavailable || r.problemCode(t) != idem.CodeStoreUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("stalled claim: %d %s %v", r.status, r.body, r.header)
	}
	if b.calls.Load() != 0 {
		t.Fatal("the handler ran without a claim")
	}
}

// In wait mode a Watch registration that never answers does not hold the
// duplicate beyond its wait.
func TestStalledWatchIsBounded(t *testing.T) {
	t.Parallel()
	s := newStallStore(t, "Watch")
	exec, err := idem.NewExecutor(plainStore{s}, &idem.Config{StoreTimeout: 100 * time.Millisecond, Wait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	running, finish := make(chan struct{}), make(chan struct{})
	first := make(chan error)
	go func() {
		_, err := exec.Do(context.Background(), doParams("k"), func(context.Context) (*idem.Response, error) {
			close(running)
			<-finish
			return &idem.Response{StatusCode: 201}, nil
		})
		first <- err
	}()
	<-running
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err = exec.Do(context.Background(), doParams("k"), nil)
	}()
	answerWithin(t, "watch", done)
	close(finish)
	if !errors.Is(err, idemstore.ErrInFlight) {
		t.Errorf("duplicate: %v, want ErrInFlight after the wait", err)
	}
	if err := <-first; err != nil {
		t.Errorf("first: %v", err)
	}
}
