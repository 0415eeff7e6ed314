package idem_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// countingRenew counts the renewals that reach the store, per key.
type countingRenew struct {
	idemstore.Store
	mu    sync.Mutex
	calls map[string]int
}

func (s *countingRenew) Renew(ctx context.Context, p idemstore.RenewParams) error {
	s.mu.Lock()
	s.calls[p.Key]++
	s.mu.Unlock()
	return s.Store.Renew(ctx, p)
}

func (s *countingRenew) renewed(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[key]
}

// renewedOps tells, per operation name, of each EventRenewed.
type renewedOps struct {
	mu sync.Mutex
	ch map[string]chan struct{}
}

func (o *renewedOps) Observe(_ context.Context, e idem.Event) {
	if e.Kind != idem.EventRenewed {
		return
	}
	o.mu.Lock()
	ch := o.ch[e.Operation]
	o.mu.Unlock()
	if ch != nil {
		ch <- struct{}{}
	}
}

func (o *renewedOps) watch(op string) <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	ch := make(chan struct{}, 64)
	o.ch[op] = ch
	return ch
}

// Slow operations of one Executor, started at different times, share one
// renewal schedule: each keeps its lease for several lease periods, so
// that a duplicate finds its key in flight, and a fast operation that
// ended before its first renewal was due is never renewed.
func TestSlowOperationsKeepTheirLeases(t *testing.T) {
	t.Parallel()
	store := &countingRenew{Store: newMemStore(t), calls: map[string]int{}}
	obs := &renewedOps{ch: map[string]chan struct{}{}}
	exec, err := idem.NewExecutor(store, &idem.Config{Lease: idem.MinLease, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ok := func(context.Context) (*idem.Response, error) { return &idem.Response{StatusCode: 201}, nil }
	for i := range 100 {
		if _, err := exec.Do(ctx, idem.DoParams{Scope: "s", Key: fmt.Sprint("fast-", i), Fingerprint: "v1:x"}, ok); err != nil {
			t.Fatal(err)
		}
	}
	const slow = 3
	var wg sync.WaitGroup
	errs := make(chan error, slow)
	for i := range slow {
		key := fmt.Sprint("slow-", i)
		renewed := obs.watch(key)
		started := make(chan struct{})
		wg.Go(func() {
			_, err := exec.Do(ctx, idem.DoParams{Scope: "s", Key: key, Fingerprint: "v1:x", Operation: key}, func(opCtx context.Context) (*idem.Response, error) {
				close(started)
				// Six renewals at a third of a lease each: two lease periods.
				for range 6 {
					select {
					case <-renewed:
					case <-opCtx.Done():
						return nil, context.Cause(opCtx)
					case <-time.After(20 * time.Second):
						return nil, fmt.Errorf("%s: no renewal", key)
					}
				}
				if _, err := exec.Do(ctx, idem.DoParams{Scope: "s", Key: key, Fingerprint: "v1:x"}, ok); err != idem.ErrInFlight {
					return nil, fmt.Errorf("%s: duplicate after two lease periods: %v, want ErrInFlight", key, err)
				}
				return &idem.Response{StatusCode: 201}, nil
			})
			errs <- err
		})
		<-started // the slow operations start one after another
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	for i := range 100 {
		if n := store.renewed(fmt.Sprint("fast-", i)); n != 0 {
			t.Fatalf("fast operation %d was renewed %d times after it ended", i, n)
		}
	}
}

// A fast operation arms no timer and starts no goroutine of its own for
// its lease: a first execution on memstore allocates the Result, the owner
// token, the execution and its contexts, and the stored response's
// encoding, and nothing for its renewals.
func TestFastOperationSchedulesNothing(t *testing.T) {
	store := newMemStore(t)
	exec, err := idem.NewExecutor(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp := &idem.Response{StatusCode: 201}
	op := func(context.Context) (*idem.Response, error) { return resp, nil }
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint(i)
	}
	i := 0
	allocs := testing.AllocsPerRun(len(keys)-1, func() {
		if _, err := exec.Do(context.Background(), idem.DoParams{Scope: "s", Key: keys[i], Fingerprint: "v1:x"}, op); err != nil {
			t.Fatal(err)
		}
		i++
	})
	// Result, token, execution, the detached context, the cancellable one
	// (two) and the encoded response: 7; a timer per call would add two,
	// a goroutine more.
	if allocs > 7 {
		t.Fatalf("a first execution allocates %v times, want at most 7", allocs)
	}
}
