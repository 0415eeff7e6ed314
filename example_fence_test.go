package idem_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

// fencedLedger is a downstream system that checks fences: it refuses a write
// whose fence is lower than the highest it has accepted.
type fencedLedger struct {
	mu      sync.Mutex
	fence   int64
	balance int
}

func (l *fencedLedger) set(fence int64, balance int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if fence < l.fence {
		return fmt.Errorf("fence %d is stale, %d was accepted", fence, l.fence)
	}
	l.fence, l.balance = fence, balance
	return nil
}

// A first attempt stalls past its lease, and a retry takes the record
// over. The retry's fence (RequestInfo.Fence) is higher. When the stale
// first attempt wakes up, the downstream ledger refuses its write, and Do
// returns ErrLeaseLost to it. Later retries replay the retry's response.
// The example moves a fake clock (Config.NowFunc) instead of waiting for the
// lease to run out.
func ExampleRequestInfo() {
	var now atomic.Int64
	now.Store(time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }

	store, _ := memstore.New(nil)
	exec, _ := idem.NewExecutor(store, &idem.Config{Lease: 30 * time.Second, NowFunc: clock})
	params := idem.DoParams{Scope: idem.Scope("tenant-1", "set-balance"), Key: "adj-7", Fingerprint: "v1:example"}
	accounts := &fencedLedger{}

	write := func(balance int) idem.Operation {
		return func(ctx context.Context) (*idem.Response, error) {
			info, _ := idem.InfoFromContext(ctx)
			if err := accounts.set(info.Fence, balance); err != nil {
				fmt.Println("ledger refused:", err)
				return nil, err
			}
			return &idem.Response{StatusCode: 200, Body: fmt.Appendf(nil, "balance %d", balance)}, nil
		}
	}

	stalled, wake := make(chan struct{}), make(chan struct{})
	first := make(chan error)
	go func() {
		_, err := exec.Do(context.Background(), params, func(ctx context.Context) (*idem.Response, error) {
			info, _ := idem.InfoFromContext(ctx)
			fmt.Println("first attempt, fence", info.Fence)
			close(stalled)
			<-wake // a long pause: garbage collection, a slow disk
			return write(100)(ctx)
		})
		first <- err
	}()
	<-stalled

	now.Add(int64(31 * time.Second)) // the first attempt's lease has run out
	res, err := exec.Do(context.Background(), params, func(ctx context.Context) (*idem.Response, error) {
		info, _ := idem.InfoFromContext(ctx)
		fmt.Println("retry, fence", info.Fence, "took over:", info.TookOver)
		return write(200)(ctx)
	})
	fmt.Println("retry:", err, string(res.Response.Body))

	close(wake)
	err = <-first
	fmt.Println("first attempt: lease lost:", errors.Is(err, idem.ErrLeaseLost))
	fmt.Println("ledger:", accounts.balance, "at fence", accounts.fence)

	res, err = exec.Do(context.Background(), params, write(300))
	fmt.Println("next retry:", err, string(res.Response.Body), "replayed:", res.Replayed)
	// Output:
	// first attempt, fence 1
	// retry, fence 2 took over: true
	// retry: <nil> balance 200
	// ledger refused: fence 1 is stale, 2 was accepted
	// first attempt: lease lost: true
	// ledger: 200 at fence 2
	// next retry: <nil> balance 200 replayed: true
}
