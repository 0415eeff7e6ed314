package idem_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

// claimCounter is a PhaseObserver that closes second when the second claim
// has ended. The example uses it only so that its output does not depend on
// timing: the first request finishes once the duplicate has found it in flight.
type claimCounter struct {
	n      atomic.Int32
	second chan struct{}
}

func (c *claimCounter) Observe(context.Context, idem.Event) {}

func (c *claimCounter) StartPhase(ctx context.Context, ph idem.Phase, _ idem.PhaseInfo) (context.Context, func(error)) {
	return ctx, func(error) {
		if ph == idem.PhaseClaim && c.n.Add(1) == 2 {
			close(c.second)
		}
	}
}

// A duplicate of a request that is still running. Without Config.Wait it is
// answered at once with 409 and Retry-After. With Config.Wait it waits for
// the first attempt and replays its response.
func ExampleConfig_wait() {
	store, _ := memstore.New(nil)
	claims := &claimCounter{second: make(chan struct{})}
	noWait, _ := idem.NewMiddleware(store, nil)
	wait, _ := idem.NewMiddleware(store, &idem.Config{Wait: 10 * time.Second, Observer: claims})

	started, finish := make(chan struct{}), make(chan struct{})
	runs := 0
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		started <- struct{}{}
		<-finish
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "report %d", runs)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /reports", noWait.Handle(slow))
	mux.Handle("POST /waiting/reports", wait.Handle(slow))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	send := func(path, key string) string {
		req, _ := http.NewRequest("POST", srv.URL+path, strings.NewReader(`{"month":"2026-11"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			return err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusConflict {
			return fmt.Sprintf("%d Retry-After: %s", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		return fmt.Sprintf("%d replayed: %s %s", resp.StatusCode, resp.Header.Get("Idempotency-Replayed"), b)
	}

	// Without waiting.
	first := make(chan string)
	go func() { first <- send("/reports", `"r-1"`) }()
	<-started
	fmt.Println("duplicate:", send("/reports", `"r-1"`))
	finish <- struct{}{}
	fmt.Println("first:", <-first)

	// With waiting.
	go func() { first <- send("/waiting/reports", `"r-2"`) }()
	<-started
	duplicate := make(chan string)
	go func() { duplicate <- send("/waiting/reports", `"r-2"`) }()
	<-claims.second // the duplicate found the first attempt in flight
	finish <- struct{}{}
	fmt.Println("first:", <-first)
	fmt.Println("duplicate:", <-duplicate)
	fmt.Println("handler runs:", runs)
	// Output:
	// duplicate: 409 Retry-After: 1
	// first: 201 replayed: false report 1
	// first: 201 replayed: false report 2
	// duplicate: 201 replayed: true report 2
	// handler runs: 2
}
