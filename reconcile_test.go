package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
)

// hopeless is a two-step operation whose second step fails for as long as
// *down is set: a provider that stays down.
type hopeless struct {
	down    atomic.Bool
	charges atomic.Int32
}

func (h *hopeless) op(ctx context.Context) (*idem.Response, error) {
	if _, err := idem.Step(ctx, "insert", func(context.Context) ([]byte, error) { return []byte("pay"), nil }); err != nil {
		return nil, err
	}
	if _, err := idem.Step(ctx, "charge", func(context.Context) ([]byte, error) {
		h.charges.Add(1)
		if h.down.Load() {
			return nil, errors.New("provider down")
		}
		return []byte("ch"), nil
	}); err != nil {
		return &idem.Response{StatusCode: 503}, nil
	}
	return &idem.Response{StatusCode: 201}, nil
}

func (h *hopeless) resume(context.Context, idemstore.StuckRecord) (idem.Operation, error) {
	return h.op, nil
}

// held lists the keys of the records the store holds for an operator.
func held(t *testing.T, s idemstore.StepStore) []string {
	t.Helper()
	recs, err := s.Stuck(t.Context(), idemstore.StuckParams{Limit: 100, Held: true, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, r := range recs {
		keys = append(keys, r.Key)
	}
	return keys
}

// After MaxAttempts attempts without an outcome (the client's first one
// included), the record is held: Reconcile no longer finds it, the store
// lists it as held, an EventHeld is emitted, and a client's retry still
// resumes it (and completes it once the provider is back).
func TestReconcileHoldsAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	store := newMemStore(t)
	kinds := &kindCounter{}
	exec, err := idem.NewExecutor(store, &idem.Config{Observer: kinds})
	if err != nil {
		t.Fatal(err)
	}
	h := &hopeless{}
	h.down.Store(true)
	if res, err := exec.Do(t.Context(), doParams("k"), h.op); err != nil || !res.Suspended || res.Held {
		t.Fatalf("client attempt: %v, suspended %v, held %v", err, res.Suspended, res.Held)
	}
	params := idem.ReconcileParams{MaxAttempts: 3}
	for i, want := range []idem.ReconcileResult{
		{Found: 1, Failed: 1},          // attempt 2
		{Found: 1, Failed: 1, Held: 1}, // attempt 3: held
		{},                             // nothing left to reconcile
		{},
	} {
		rr, err := exec.Reconcile(t.Context(), params, h.resume)
		if rr != want || (want.Failed > 0) != (err != nil) {
			t.Fatalf("Reconcile %d = %+v, %v; want %+v", i+1, rr, err, want)
		}
	}
	if got := h.charges.Load(); got != 3 {
		t.Errorf("the provider was called %d times, want 3 (MaxAttempts)", got)
	}
	if keys := held(t, store); len(keys) != 1 || keys[0] != "k" {
		t.Errorf("held records = %q, want k", keys)
	}
	if kinds.get(idem.EventHeld) != 1 || kinds.get(idem.EventSuspended) != 2 {
		t.Errorf("events: %d held, %d suspended; want 1 and 2", kinds.get(idem.EventHeld), kinds.get(idem.EventSuspended))
	}
	// A client's retry still resumes it; failing again, it stays held.
	res, err := exec.Do(t.Context(), doParams("k"), h.op)
	if err != nil || !res.TookOver || !res.Suspended || !res.Held {
		t.Fatalf("client retry of a held record: %v, took over %v, suspended %v, held %v", err, res.TookOver, res.Suspended, res.Held)
	}
	if keys := held(t, store); len(keys) != 1 {
		t.Errorf("after a failed client retry, held records = %q, want k", keys)
	}
	h.down.Store(false)
	res, err = exec.Do(t.Context(), doParams("k"), h.op)
	if err != nil || res.Response.StatusCode != 201 || res.Held {
		t.Fatalf("client retry with the provider back: %v, %+v", err, res)
	}
	if keys := held(t, store); len(keys) != 0 {
		t.Errorf("after completion, held records = %q", keys)
	}
}

// MaxAge holds an operation whose first recovery point is older than it,
// by the executor's clock.
func TestReconcileHoldsAfterMaxAge(t *testing.T) {
	t.Parallel()
	store := newMemStore(t)
	var now atomic.Int64
	now.Store(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	exec, err := idem.NewExecutor(store, &idem.Config{NowFunc: func() time.Time { return time.Unix(0, now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	advance := func(d time.Duration) { now.Add(int64(d)) }
	h := &hopeless{}
	h.down.Store(true)
	if _, err := exec.Do(t.Context(), doParams("k"), h.op); err != nil {
		t.Fatal(err)
	}
	params := idem.ReconcileParams{MaxAge: time.Hour, MaxAttempts: 1000}
	advance(59 * time.Minute)
	if rr, _ := exec.Reconcile(t.Context(), params, h.resume); rr.Held != 0 || rr.Found != 1 {
		t.Fatalf("at 59 minutes: %+v, want found and not held", rr)
	}
	advance(time.Minute)
	if rr, _ := exec.Reconcile(t.Context(), params, h.resume); rr.Held != 1 {
		t.Fatalf("at 60 minutes: %+v, want held", rr)
	}
	advance(time.Minute)
	if rr, err := exec.Reconcile(t.Context(), params, h.resume); rr.Found != 0 || err != nil {
		t.Fatalf("after holding: %+v, %v; want nothing found", rr, err)
	}
	if h.charges.Load() != 3 {
		t.Errorf("%d provider calls, want 3", h.charges.Load())
	}
}

// A record whose operation resume cannot rebuild is held at once: it is
// never found again, instead of being found and failing on every call.
func TestReconcileHoldsWhatItCannotResume(t *testing.T) {
	t.Parallel()
	store := newMemStore(t)
	exec, _ := idem.NewExecutor(store, nil)
	h := &hopeless{}
	h.down.Store(true)
	if _, err := exec.Do(t.Context(), doParams("k"), h.op); err != nil {
		t.Fatal(err)
	}
	broken := errors.New("the payment row is gone")
	resume := func(context.Context, idemstore.StuckRecord) (idem.Operation, error) { return nil, broken }
	rr, err := exec.Reconcile(t.Context(), idem.ReconcileParams{}, resume)
	if rr != (idem.ReconcileResult{Found: 1, Failed: 1, Held: 1}) || !errors.Is(err, broken) {
		t.Fatalf("Reconcile = %+v, %v; want held, with resume's error", rr, err)
	}
	if rr, err := exec.Reconcile(t.Context(), idem.ReconcileParams{}, resume); rr.Found != 0 || err != nil {
		t.Fatalf("second Reconcile = %+v, %v; want nothing found", rr, err)
	}
	if keys := held(t, store); len(keys) != 1 {
		t.Errorf("held = %q, want k", keys)
	}
	// The checkpoint is intact: the client's retry resumes after the
	// first step.
	h.down.Store(false)
	if res, err := exec.Do(t.Context(), doParams("k"), h.op); err != nil || res.Response.StatusCode != 201 {
		t.Fatalf("client retry: %v, %+v", err, res)
	}
}

// Reconcile runs up to Concurrency operations at once: operations that
// hang do not hold up one that completes, and no more than Concurrency
// run at the same time.
func TestReconcileConcurrency(t *testing.T) {
	t.Parallel()
	store := newMemStore(t)
	exec, _ := idem.NewExecutor(store, nil)
	stuckOp := func(ctx context.Context) (*idem.Response, error) {
		if _, err := idem.Step(ctx, "insert", func(context.Context) ([]byte, error) { return nil, nil }); err != nil {
			return nil, err
		}
		return &idem.Response{StatusCode: 503}, nil
	}
	// Four hanging operations first (the oldest leases), then the one
	// that completes, then two more hanging ones.
	keys := []string{"hang-1", "hang-2", "fast", "hang-3", "hang-4", "hang-5"}
	for _, k := range keys {
		if res, err := exec.Do(t.Context(), doParams(k), stuckOp); err != nil || !res.Suspended {
			t.Fatalf("%s: %v, %+v", k, err, res)
		}
	}
	release, fastDone := make(chan struct{}), make(chan struct{})
	var running, most atomic.Int32
	resume := func(_ context.Context, rec idemstore.StuckRecord) (idem.Operation, error) {
		return func(ctx context.Context) (*idem.Response, error) {
			n := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			if rec.Key == "fast" {
				// It runs while both hanging operations before it do.
				for running.Load() < 3 {
					select {
					case <-ctx.Done():
						return nil, ctx.Err()
					case <-time.After(time.Millisecond):
					}
				}
				close(fastDone)
			} else {
				select {
				case <-release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return &idem.Response{StatusCode: 201}, nil
		}, nil
	}
	type outcome struct {
		rr  idem.ReconcileResult
		err error
	}
	out := make(chan outcome, 1)
	go func() {
		rr, err := exec.Reconcile(t.Context(), idem.ReconcileParams{Concurrency: 3}, resume)
		out <- outcome{rr, err}
	}()
	select {
	case <-fastDone:
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("the operation that completes waited behind the hanging ones")
	}
	close(release)
	o := <-out
	if o.err != nil || o.rr != (idem.ReconcileResult{Found: 6, Completed: 6}) {
		t.Fatalf("Reconcile = %+v, %v", o.rr, o.err)
	}
	if m := most.Load(); m != 3 {
		t.Errorf("up to %d operations ran at once, want 3 (Concurrency)", m)
	}
}

// An operation resumed in vain goes to the back: with more stuck
// operations than one call's Limit, successive calls reach every one of
// them instead of retrying the same ones.
func TestReconcileGoesRoundAllStuckOperations(t *testing.T) {
	t.Parallel()
	store := newMemStore(t)
	exec, _ := idem.NewExecutor(store, nil)
	h := &hopeless{}
	h.down.Store(true)
	for i := range 10 {
		if _, err := exec.Do(t.Context(), doParams(fmt.Sprintf("k%d", i)), h.op); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	seen := map[string]int{}
	resume := func(_ context.Context, rec idemstore.StuckRecord) (idem.Operation, error) {
		mu.Lock()
		seen[rec.Key]++
		mu.Unlock()
		return h.op, nil
	}
	// Three calls of four: every operation is reached once before any
	// is resumed a third time.
	for range 3 {
		if rr, _ := exec.Reconcile(t.Context(), idem.ReconcileParams{Limit: 4, Concurrency: 2}, resume); rr.Found != 4 {
			t.Fatalf("Reconcile found %d, want 4", rr.Found)
		}
	}
	for i := range 10 {
		if n := seen[fmt.Sprintf("k%d", i)]; n < 1 || n > 2 {
			t.Errorf("k%d resumed %d times, want 1 or 2 (seen %v)", i, n, seen)
		}
	}
}

// Cancelling Reconcile's context stops it: the running operation ends
// with it, those not started stay stuck for the next call.
func TestReconcileStopsWithItsContext(t *testing.T) {
	t.Parallel()
	store := newMemStore(t)
	exec, _ := idem.NewExecutor(store, nil)
	h := &hopeless{}
	h.down.Store(true)
	for i := range 3 {
		if _, err := exec.Do(t.Context(), doParams(fmt.Sprintf("k%d", i)), h.op); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	started := make(chan struct{})
	resume := func(context.Context, idemstore.StuckRecord) (idem.Operation, error) {
		return func(ctx context.Context) (*idem.Response, error) {
			close(started) // only one ever starts
			<-ctx.Done()
			return nil, ctx.Err()
		}, nil
	}
	go func() {
		<-started
		cancel()
	}()
	rr, err := exec.Reconcile(ctx, idem.ReconcileParams{Concurrency: 1}, resume)
	if rr != (idem.ReconcileResult{Found: 3, Failed: 1}) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Reconcile = %+v, %v; want one failed, stopped by its context", rr, err)
	}
	if rr, _ := exec.Reconcile(t.Context(), idem.ReconcileParams{}, h.resume); rr.Found != 3 {
		t.Errorf("next Reconcile found %d, want all 3 still stuck", rr.Found)
	}
}

func TestReconcileRejectsNegativeParams(t *testing.T) {
	t.Parallel()
	exec, _ := idem.NewExecutor(newMemStore(t), nil)
	for _, p := range []idem.ReconcileParams{{Limit: -1}, {Concurrency: -1}, {MaxAttempts: -1}, {MaxAge: -time.Second}} {
		if _, err := exec.Reconcile(t.Context(), p, (&hopeless{}).resume); err == nil {
			t.Errorf("Reconcile(%+v) accepted", p)
		}
	}
}

var _ idemstore.StepStore = (*memstore.Store)(nil)
