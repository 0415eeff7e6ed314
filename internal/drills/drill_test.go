package drills_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// drill is a service on a store under steady traffic of new keys and
// duplicates, recording every request, for the failover drills.
type drill struct {
	t      *testing.T
	srv    *httptest.Server
	client *http.Client

	mu    sync.Mutex
	execs map[string]int // handler runs by key
	reqs  []request
	keys  []string // every key a request was sent for
}

// request is one request of the traffic.
type request struct {
	key      string
	at, done time.Time
	status   int
}

// newDrill serves a handler behind idem on store. The lease outlasts the
// drill, so a key that executes twice did so because the store forgot it,
// never because a lease expired.
func newDrill(t *testing.T, store idemstore.Store) *drill {
	d := &drill{t: t, execs: map[string]int{}, client: &http.Client{Timeout: 30 * time.Second}}
	mw, err := idem.NewMiddleware(store, &idem.Config{Lease: time.Minute, StoreTimeout: time.Second,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	d.srv = httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idem.InfoFromContext(r.Context())
		d.mu.Lock()
		d.execs[info.Key]++
		d.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"ok":true}`)
	})))
	t.Cleanup(d.srv.Close)
	t.Cleanup(d.client.CloseIdleConnections)
	return d
}

// post sends one request for key and records it.
func (d *drill) post(ctx context.Context, key string) int {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, d.srv.URL, strings.NewReader(`{"amount":1}`))
	req.Header.Set(idem.HeaderKey, `"`+key+`"`)
	req.Header.Set("Content-Type", "application/json")
	r := request{key: key, at: time.Now()}
	resp, err := d.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			d.t.Errorf("POST %s: %v", key, err)
		}
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r.done, r.status = time.Now(), resp.StatusCode
	d.mu.Lock()
	d.reqs = append(d.reqs, r)
	d.mu.Unlock()
	return r.status
}

// traffic runs workers until ctx ends. Each sends a new key, then a
// duplicate of it and one of a key it sent earlier; a request refused with
// 503 is retried (as a client would) before the worker moves on.
func (d *drill) traffic(ctx context.Context, name string, workers int) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			var mine []string
			for n := 0; ctx.Err() == nil; n++ {
				key := fmt.Sprintf("%s-w%d-%d", name, w, n)
				d.mu.Lock()
				d.keys = append(d.keys, key)
				d.mu.Unlock()
				mine = append(mine, key)
				for _, k := range []string{key, key, mine[len(mine)/2]} {
					for d.post(ctx, k) == http.StatusServiceUnavailable && ctx.Err() == nil {
						wait(ctx, 20*time.Millisecond)
					}
				}
			}
		})
	}
	wg.Wait()
}

// replayAll sends one more duplicate of every key once the store is back,
// and counts how many were executed again (the store forgot their record).
func (d *drill) replayAll(ctx context.Context) {
	d.mu.Lock()
	keys := slices.Clone(d.keys)
	d.mu.Unlock()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(keys) && ctx.Err() == nil; i = int(next.Add(1)) - 1 {
				for d.post(ctx, keys[i]) == http.StatusServiceUnavailable && ctx.Err() == nil {
					wait(ctx, 50*time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
}

// result is what a drill measured.
type result struct {
	Keys, Requests, Refused int
	// Duplicates counts keys whose operation ran more than once.
	Duplicates int
	// Window is the time from the fault to the last refused request:
	// how long some requests were refused.
	Window time.Duration
	// P50 and P99 are the latencies of requests before the fault.
	P50, P99 time.Duration
}

func (r result) String() string {
	return fmt.Sprintf("%d keys, %d requests: %d executed twice or more; %d refused (503) within %v of the fault; latency before the fault p50 %v p99 %v",
		r.Keys, r.Requests, r.Duplicates, r.Refused, r.Window.Round(10*time.Millisecond),
		r.P50.Round(10*time.Microsecond), r.P99.Round(10*time.Microsecond))
}

// result summarises the drill; fault is when the fault was injected.
func (d *drill) result(fault time.Time) result {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := result{Keys: len(d.execs), Requests: len(d.reqs)}
	for _, n := range d.execs {
		if n > 1 {
			r.Duplicates++
		}
	}
	var lat []time.Duration
	for _, q := range d.reqs {
		if q.done.Before(fault) {
			lat = append(lat, q.done.Sub(q.at))
		}
		if q.status == http.StatusServiceUnavailable {
			r.Refused++
			if w := q.done.Sub(fault); w > r.Window {
				r.Window = w
			}
		}
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		r.P50, r.P99 = lat[len(lat)/2], lat[len(lat)*99/100]
	}
	return r
}
