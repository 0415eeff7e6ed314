package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
)

// kindCounter is an Observer that counts events by kind.
type kindCounter struct {
	mu sync.Mutex
	n  map[idem.EventKind]int
}

func (k *kindCounter) Observe(_ context.Context, e idem.Event) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.n == nil {
		k.n = map[idem.EventKind]int{}
	}
	k.n[e.Kind]++
}

func (k *kindCounter) get(kind idem.EventKind) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n[kind]
}

func newMemStore(t *testing.T) *memstore.Store {
	t.Helper()
	s, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A two-step operation that fails in its second step is suspended, not
// released; the retry resumes after the first step, which never runs again.
func TestStepsResumeAfterTheLastRecoveryPoint(t *testing.T) {
	t.Parallel()
	store := newMemStore(t)
	kinds := &kindCounter{}
	exec, err := idem.NewExecutor(store, &idem.Config{Observer: kinds})
	if err != nil {
		t.Fatal(err)
	}
	var firstRuns, secondRuns atomic.Int32
	failSecond := true
	op := func(ctx context.Context) (*idem.Response, error) {
		a, err := idem.Step(ctx, "first", func(context.Context) ([]byte, error) {
			firstRuns.Add(1)
			return []byte("pay_1"), nil
		})
		if err != nil {
			return nil, err
		}
		b, err := idem.Step(ctx, "second", func(context.Context) ([]byte, error) {
			secondRuns.Add(1)
			if failSecond {
				return nil, fmt.Errorf("provider timed out: %w", idem.ErrOutcomeUnknown)
			}
			return []byte("ch_1"), nil
		})
		if err != nil {
			return nil, err
		}
		return &idem.Response{StatusCode: 201, Body: []byte(string(a) + "/" + string(b))}, nil
	}
	res, err := exec.Do(t.Context(), doParams("k"), op)
	if !errors.Is(err, idem.ErrOutcomeUnknown) || !res.Suspended || res.Released {
		t.Fatalf("first attempt: err %v, suspended %v, released %v; want ErrOutcomeUnknown, suspended", err, res.Suspended, res.Released)
	}
	recs, err := store.Stuck(t.Context(), idemstore.StuckParams{Limit: 10, Now: time.Now()})
	if err != nil || len(recs) != 1 {
		t.Fatalf("Stuck = %v, %v; want the suspended record", recs, err)
	}
	steps, err := idem.ParseCheckpoint(recs[0].Checkpoint)
	if err != nil || len(steps) != 2 || !steps[0].Done || !steps[1].Unknown {
		t.Fatalf("checkpoint steps = %+v, %v; want first done, second unknown", steps, err)
	}

	if kinds.get(idem.EventSuspended) != 1 || kinds.get(idem.EventReleased) != 0 {
		t.Errorf("events: %d suspended, %d released; want 1 and 0", kinds.get(idem.EventSuspended), kinds.get(idem.EventReleased))
	}
	failSecond = false
	res, err = exec.Do(t.Context(), doParams("k"), op)
	if err != nil || !res.TookOver || string(res.Response.Body) != "pay_1/ch_1" {
		t.Fatalf("retry: %v, took over %v, body %q", err, res.TookOver, res.Response.Body)
	}
	if firstRuns.Load() != 1 || secondRuns.Load() != 2 {
		t.Errorf("runs: first %d, second %d; want 1 and 2", firstRuns.Load(), secondRuns.Load())
	}
	res, err = exec.Do(t.Context(), doParams("k"), op)
	if err != nil || !res.Replayed || string(res.Response.Body) != "pay_1/ch_1" {
		t.Fatalf("replay: %v, replayed %v", err, res.Replayed)
	}
}

// Without a recovery point, a failed operation is released as before.
func TestStepsFailureBeforeAnyStepReleases(t *testing.T) {
	t.Parallel()
	exec, err := idem.NewExecutor(newMemStore(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	res, err := exec.Do(t.Context(), doParams("k"), func(ctx context.Context) (*idem.Response, error) {
		_, err := idem.Step(ctx, "only", func(context.Context) ([]byte, error) { return nil, boom })
		return nil, err
	})
	if !errors.Is(err, boom) || res.Suspended {
		t.Fatalf("err %v, suspended %v", err, res.Suspended)
	}
	res, err = exec.Do(t.Context(), doParams("k"), func(context.Context) (*idem.Response, error) {
		return &idem.Response{StatusCode: 200}, nil
	})
	if err != nil || res.TookOver {
		t.Fatalf("after release: %v, took over %v; want a fresh execution", err, res.TookOver)
	}
}

// ledger is a downstream system that accepts a write only with a fence at
// least as high as the highest it has seen for the key.
type ledger struct {
	mu      sync.Mutex
	fences  map[string]int64
	writes  []string
	refused []string
}

func (l *ledger) write(key string, fence int64, what string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if fence < l.fences[key] {
		l.refused = append(l.refused, what)
		return fmt.Errorf("stale fence %d < %d", fence, l.fences[key])
	}
	l.fences[key] = fence
	l.writes = append(l.writes, what)
	return nil
}

// A stale owner (its lease taken over mid-step by a second executor) can
// commit neither its step nor, through the fence, its downstream write.
func TestStaleOwnerCannotCommitItsStep(t *testing.T) {
	t.Parallel()
	store := newMemStore(t)
	clock := newFakeClock()
	// A long lease in real time: renewals never fire; the fake clock moves
	// past the lease instead.
	cfg := &idem.Config{Lease: time.Hour, TTL: 24 * time.Hour, NowFunc: clock.Now}
	stale, err := idem.NewExecutor(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	successor, err := idem.NewExecutor(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	down := &ledger{fences: map[string]int64{}}
	step := func(who string, inside, proceed chan struct{}) idem.Operation {
		return func(ctx context.Context) (*idem.Response, error) {
			_, err := idem.Step(ctx, "write", func(ctx context.Context) ([]byte, error) {
				info, ok := idem.InfoFromContext(ctx)
				if !ok || info.Fence == 0 {
					return nil, errors.New("no fence")
				}
				fence := info.Fence
				if inside != nil {
					close(inside)
					<-proceed
				}
				return nil, down.write("acct-1", fence, who)
			})
			if err != nil {
				return nil, err
			}
			return &idem.Response{StatusCode: 200, Body: []byte(who)}, nil
		}
	}
	inside, proceed := make(chan struct{}), make(chan struct{})
	type outcome struct {
		res *idem.Result
		err error
	}
	staleDone := make(chan outcome, 1)
	go func() {
		res, err := stale.Do(context.Background(), doParams("k"), step("stale", inside, proceed))
		staleDone <- outcome{res, err}
	}()
	select {
	case <-inside:
	case <-time.After(10 * time.Second):
		t.Fatal("the first executor never reached its step")
	}
	clock.Advance(2 * time.Hour)
	res, err := successor.Do(t.Context(), doParams("k"), step("successor", nil, nil))
	if err != nil || !res.TookOver || string(res.Response.Body) != "successor" {
		t.Fatalf("successor: %v, took over %v", err, res != nil && res.TookOver)
	}
	close(proceed)
	var o outcome
	select {
	case o = <-staleDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the stale executor never returned")
	}
	// The downstream system refused the write, and the executor reports the
	// lost lease (the record belongs to the successor).
	if !errors.Is(o.err, idemstore.ErrLeaseLost) {
		t.Errorf("stale owner's error = %v, want ErrLeaseLost", o.err)
	}
	if len(down.refused) != 1 || down.refused[0] != "stale" {
		t.Errorf("downstream refusals = %v, want the stale owner's", down.refused)
	}
	if len(down.writes) != 1 || down.writes[0] != "successor" {
		t.Errorf("downstream writes = %v, want only the successor's", down.writes)
	}
	res, err = successor.Do(t.Context(), doParams("k"), step("late", nil, nil))
	if err != nil || !res.Replayed || string(res.Response.Body) != "successor" {
		t.Fatalf("after both: %v, replayed %v", err, res != nil && res.Replayed)
	}
}

// A stale owner whose downstream call does not check fences still cannot
// commit its recovery point.
func TestStaleOwnerStepIsFencedByTheStore(t *testing.T) {
	t.Parallel()
	store := newMemStore(t)
	clock := newFakeClock()
	cfg := &idem.Config{Lease: time.Hour, TTL: 24 * time.Hour, NowFunc: clock.Now}
	stale, _ := idem.NewExecutor(store, cfg)
	successor, _ := idem.NewExecutor(store, cfg)
	inside, proceed := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := stale.Do(context.Background(), doParams("k"), func(ctx context.Context) (*idem.Response, error) {
			_, err := idem.Step(ctx, "s", func(context.Context) ([]byte, error) {
				close(inside)
				<-proceed
				return []byte("stale"), nil
			})
			return &idem.Response{StatusCode: 200}, err
		})
		errc <- err
	}()
	<-inside
	clock.Advance(2 * time.Hour)
	if _, err := store.Claim(t.Context(), idemstore.ClaimParams{Scope: doParams("k").Scope, Key: "k", Fingerprint: "v1:abc",
		Token: "successor", Lease: time.Hour, TTL: 24 * time.Hour, Now: clock.Now()}); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	if err := <-errc; !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("stale step: %v, want ErrLeaseLost", err)
	}
	_ = successor
}

func TestFencesGrowAcrossClaims(t *testing.T) {
	t.Parallel()
	exec, _ := idem.NewExecutor(newMemStore(t), nil)
	var last int64
	for i := range 3 {
		_, err := exec.Do(t.Context(), doParams("k"), func(ctx context.Context) (*idem.Response, error) {
			info, ok := idem.InfoFromContext(ctx)
			if !ok {
				t.Fatalf("claim %d: no execution in the context", i)
			}
			f := info.Fence
			if f <= last {
				t.Errorf("claim %d: fence %d, want > %d", i, f, last)
			}
			last = f
			return &idem.Response{StatusCode: 500}, nil // released: the key is claimed again
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestDeriveKey(t *testing.T) {
	t.Parallel()
	secret := []byte("0123456789abcdef0123456789abcdef")
	a := idem.DeriveKeyWith(secret, "s", "k", "charge")
	if a != idem.DeriveKeyWith(secret, "s", "k", "charge") {
		t.Error("not deterministic")
	}
	for _, other := range []string{
		idem.DeriveKeyWith(secret, "s", "k", "refund"),
		idem.DeriveKeyWith(secret, "s", "k2", "charge"),
		idem.DeriveKeyWith(secret, "s2", "k", "charge"),
		idem.DeriveKeyWith(secret, "sk", "", "charge"), // no ambiguity between fields
		idem.DeriveKeyWith(nil, "s", "k", "charge"),
		idem.DeriveKeyWith([]byte("another secret, 16+ bytes"), "s", "k", "charge"),
	} {
		if other == a {
			t.Errorf("two inputs derive %q", a)
		}
	}
	if got, err := idem.ParseKey([]string{a}); err != nil || got != a {
		t.Errorf("derived key %q is not a valid Idempotency-Key: %v", a, err)
	}
	if strings.Contains(a, "k") && strings.Contains(idem.DeriveKeyWith(secret, "s", "my-client-key", "charge"), "my-client-key") {
		t.Error("the derived key contains the client's key")
	}

	exec, err := idem.NewExecutor(newMemStore(t), &idem.Config{DeriveKeySecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	_, err = exec.Do(t.Context(), doParams("k"), func(ctx context.Context) (*idem.Response, error) {
		got, err := idem.DeriveKey(ctx, "charge")
		if err != nil || got != idem.DeriveKeyWith(secret, doParams("k").Scope, "k", "charge") {
			t.Errorf("DeriveKey = %q, %v", got, err)
		}
		return &idem.Response{StatusCode: 200}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idem.DeriveKey(t.Context(), "charge"); !errors.Is(err, idem.ErrNoExecution) {
		t.Errorf("DeriveKey outside an execution: %v", err)
	}
	if _, err := idem.NewExecutor(newMemStore(t), &idem.Config{DeriveKeySecret: []byte("short")}); err == nil {
		t.Error("a 5-byte secret was accepted")
	}
}

// Reconcile completes a suspended operation with the same steps.
func TestReconcileCompletesStuckOperations(t *testing.T) {
	t.Parallel()
	store := newMemStore(t)
	exec, _ := idem.NewExecutor(store, nil)
	var charges atomic.Int32
	up := false
	op := func(ctx context.Context) (*idem.Response, error) {
		id, err := idem.Step(ctx, "insert", func(context.Context) ([]byte, error) { return []byte("pay_9"), nil })
		if err != nil {
			return nil, err
		}
		if _, err := idem.Step(ctx, "charge", func(context.Context) ([]byte, error) {
			if !up {
				return nil, errors.New("provider down")
			}
			charges.Add(1)
			return []byte("ch_9"), nil
		}); err != nil {
			return &idem.Response{StatusCode: 503}, nil
		}
		return &idem.Response{StatusCode: 201, Body: id}, nil
	}
	res, err := exec.Do(t.Context(), doParams("k"), op)
	if err != nil || !res.Suspended || res.Response.StatusCode != 503 {
		t.Fatalf("first attempt: %v, suspended %v", err, res.Suspended)
	}
	up = true
	rr, err := exec.Reconcile(t.Context(), idem.ReconcileParams{}, func(_ context.Context, rec idemstore.StuckRecord) (idem.Operation, error) {
		steps, err := idem.ParseCheckpoint(rec.Checkpoint)
		if err != nil || len(steps) != 1 || string(steps[0].Data) != "pay_9" {
			return nil, fmt.Errorf("steps %+v: %v", steps, err)
		}
		return op, nil
	})
	if err != nil || rr.Found != 1 || rr.Completed != 1 {
		t.Fatalf("Reconcile = %+v, %v", rr, err)
	}
	res, err = exec.Do(t.Context(), doParams("k"), op)
	if err != nil || !res.Replayed || string(res.Response.Body) != "pay_9" || charges.Load() != 1 {
		t.Fatalf("after reconcile: %v, replayed %v, charges %d", err, res.Replayed, charges.Load())
	}
}

func TestStepOutsideAStepStore(t *testing.T) {
	t.Parallel()
	if _, err := idem.Step(t.Context(), "x", func(context.Context) ([]byte, error) { return nil, nil }); !errors.Is(err, idem.ErrStepsUnsupported) {
		t.Errorf("Step outside an execution: %v", err)
	}
}

// Through the middleware: a handler whose second step fails answers 503;
// the record stays at its recovery point, and the retry resumes there.
func TestStepsThroughTheMiddleware(t *testing.T) {
	t.Parallel()
	mw, err := idem.NewMiddleware(newMemStore(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	var inserts, charges atomic.Int32
	providerUp := false
	h := mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		id, err := idem.Step(ctx, "insert", func(context.Context) ([]byte, error) {
			inserts.Add(1)
			return []byte("pay_1"), nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		key, _ := idem.DeriveKey(ctx, "charge")
		if _, err := idem.Step(ctx, "charge", func(context.Context) ([]byte, error) {
			if !providerUp {
				return nil, errors.New("provider down")
			}
			charges.Add(1)
			return []byte(key), nil
		}); err != nil {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "step incomplete", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "%s charged", id)
	}))
	post := func() *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(`{"a":1}`))
		req.Header.Set(idem.HeaderKey, `"k1"`)
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := post(); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("first attempt: %d, want 503", rec.Code)
	}
	providerUp = true
	rec := post()
	if rec.Code != http.StatusCreated || rec.Body.String() != "pay_1 charged" {
		t.Fatalf("retry: %d %q", rec.Code, rec.Body.String())
	}
	if rec := post(); rec.Code != http.StatusCreated || rec.Header().Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("replay: %d replayed %q", rec.Code, rec.Header().Get(idem.HeaderReplayed))
	}
	if inserts.Load() != 1 || charges.Load() != 1 {
		t.Errorf("inserts %d, charges %d; want 1 each", inserts.Load(), charges.Load())
	}
}
