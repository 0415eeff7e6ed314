package idem_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
)

// Rule 3: fingerprint.

func TestReorderedJSONIsTheSameRequest(t *testing.T) {
	t.Parallel()
	b := setup(t, created, nil)
	first := b.post(`{"amount":100,"currency":"USD","meta":{"a":1,"b":2}}`, "k")
	second := b.post("{ \"meta\": {\"b\":2, \"a\":1.0},\n \"currency\":\"USD\", \"amount\": 1e2 }", "k")
	if second.status != 201 || second.header.Get(idem.HeaderReplayed) != "true" || !bytes.Equal(first.body, second.body) {
		t.Fatalf("reordered JSON: %d %s", second.status, second.body)
	}
}

func TestDifferentPayloadIs422(t *testing.T) {
	t.Parallel()
	b := setup(t, created, nil)
	first := b.post(`{"amount":9007199254740993}`, "k")
	second := b.post(`{"amount":9007199254740992}`, "k")
	if second.status != 422 || second.problemCode(t) != idem.CodeKeyReused {
		t.Fatalf("different payload: %d %s", second.status, second.body)
	}
	if bytes.Contains(second.body, first.body) || second.header.Get("Location") != "" {
		t.Fatal("the 422 carries the original response")
	}
	if second.header.Get(idem.HeaderKey) != `"k"` || second.header.Get(idem.HeaderReplayed) != "false" ||
		second.header.Get(idem.HeaderExpiresAt) != first.header.Get(idem.HeaderExpiresAt) {
		t.Errorf("422 headers: %v", second.header)
	}
	// Also while the first is still in flight.
	release := newGate()
	defer release.open()
	started := make(chan struct{})
	slow := setup(t, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		release.wait()
		created(w, r)
	}, nil)
	done := make(chan result)
	go func() { done <- slow.post(body1, "k") }()
	<-started
	if r := slow.post(`{"amount":1}`, "k"); r.status != 422 {
		t.Errorf("different payload while in flight: %d", r.status)
	}
	release.open()
	<-done
	if n := b.calls.Load() + slow.calls.Load(); n != 2 {
		t.Fatalf("handlers ran %d times, want 2", n)
	}
}

func TestInvalidJSONIsRejectedBeforeClaim(t *testing.T) {
	t.Parallel()
	b := setup(t, created, nil)
	for _, body := range []string{`{"a":1,"a":2}`, "{\"a\":\"\xff\"}", `{"a":`} {
		r := b.post(body, "k")
		if r.status != 400 || r.problemCode(t) != idem.CodeBodyInvalid {
			t.Errorf("body %q: %d %s", body, r.status, r.body)
		}
	}
	// The key was not consumed.
	if r := b.post(body1, "k"); r.status != 201 || r.header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("key after rejected bodies: %d", r.status)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestRequestTooLarge(t *testing.T) {
	t.Parallel()
	b := setup(t, created, &options{cfg: &idem.Config{MaxRequestBody: 64}})
	big := `{"x":"` + strings.Repeat("a", 100) + `"}`
	if r := b.post(big, "k"); r.status != 413 || r.problemCode(t) != idem.CodeRequestTooLarge {
		t.Fatalf("over the limit: %d %s", r.status, r.body)
	}
	// Without Content-Length (chunked) too.
	req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/things", io.MultiReader(strings.NewReader(big)))
	req.Header.Set("Idempotency-Key", "k")
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 413 {
		t.Fatalf("chunked over the limit: %d", resp.StatusCode)
	}
	if r := b.post(body1, "k"); r.status != 201 {
		t.Fatalf("key after 413: %d", r.status)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

// TestFingerprintFunc shows the hook that validates and normalises a
// payload before the claim: "usd" and "USD" are one request, and an invalid
// request is answered with the application's own problem without consuming
// the key.
func TestFingerprintFunc(t *testing.T) {
	t.Parallel()
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		info, _ := idem.InfoFromContext(r.Context())
		w.WriteHeader(201)
		fmt.Fprintf(w, "payload %s at %d", info.Payload, time.Now().UnixNano())
	}, &options{cfg: &idem.Config{FingerprintFunc: func(r *http.Request, body []byte) ([]byte, error) {
		var p struct{ Currency string }
		if err := json.Unmarshal(body, &p); err != nil || len(p.Currency) != 3 {
			return nil, &idem.Problem{Status: 400, Code: "validation_failed", Title: "Invalid payment",
				Extensions: map[string]any{"errors": map[string]string{"currency": "must be 3 letters"}}}
		}
		return []byte(strings.ToUpper(p.Currency)), nil
	}}})
	r := b.post(`{"currency":"dollars"}`, "k")
	if r.status != 400 || r.problemCode(t) != "validation_failed" || !bytes.Contains(r.body, []byte(`"currency":"must be 3 letters"`)) {
		t.Fatalf("invalid payload: %d %s", r.status, r.body)
	}
	first := b.post(`{"currency":"usd"}`, "k")
	if !bytes.Contains(first.body, []byte(`payload USD`)) {
		t.Errorf("the handler did not receive the normalised payload: %s", first.body)
	}
	second := b.post(`{"currency":"USD"}`, "k")
	if first.status != 201 || second.header.Get(idem.HeaderReplayed) != "true" || b.calls.Load() != 1 {
		t.Fatalf("usd then USD: %d, %d, replayed %q", first.status, second.status, second.header.Get(idem.HeaderReplayed))
	}
	if r := b.post(`{"currency":"EUR"}`, "k"); r.status != 422 {
		t.Fatalf("EUR with the same key: %d", r.status)
	}
}

// Rule 4: the four outcomes, and parallel duplicates.

func TestReplayIsExact(t *testing.T) {
	t.Parallel()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte(`{"compressed":true}`))
	zw.Close()
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Content-Encoding", "gzip")
		h.Set("Vary", "Accept-Encoding")
		h.Add("X-Multi", "one")
		h.Add("X-Multi", "two")
		h.Set("Set-Cookie", "session=secret")
		h.Set("Set-Cookie2", "legacy=secret")
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "per-connection")
		h.Set("Keep-Alive", "timeout=5")
		w.WriteHeader(http.StatusAccepted)
		w.Write(gz.Bytes())
	}, nil)
	req := func() *http.Response {
		rq, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/things", strings.NewReader(body1))
		rq.Header.Set("Idempotency-Key", `"exact"`)
		rq.Header.Set("Accept-Encoding", "gzip") // keep the transport from decoding
		resp, err := b.srv.Client().Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	read := func(resp *http.Response) []byte {
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return data
	}
	r1 := req()
	b1 := read(r1)
	r2 := req()
	b2 := read(r2)
	if r2.StatusCode != 202 || !bytes.Equal(b1, b2) || !bytes.Equal(b2, gz.Bytes()) {
		t.Fatalf("replay: %d, %d bytes vs %d", r2.StatusCode, len(b2), len(b1))
	}
	if r1.Header.Get(idem.HeaderReplayed) != "false" || r2.Header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("Idempotency-Replayed: %q then %q", r1.Header.Get(idem.HeaderReplayed), r2.Header.Get(idem.HeaderReplayed))
	}
	for _, h := range []string{"Content-Type", "Content-Encoding", "Vary"} {
		if r1.Header.Get(h) != r2.Header.Get(h) {
			t.Errorf("%s: %q then %q", h, r1.Header.Get(h), r2.Header.Get(h))
		}
	}
	if got := r2.Header.Values("X-Multi"); len(got) != 2 || got[0] != "one" || got[1] != "two" {
		t.Errorf("X-Multi replayed as %q", got)
	}
	if r1.Header.Get("Set-Cookie") == "" || r2.Header.Get("Set-Cookie") != "" {
		t.Errorf("Set-Cookie: first %q, replay %q; want sent once, never replayed", r1.Header.Get("Set-Cookie"), r2.Header.Get("Set-Cookie"))
	}
	if r1.Header.Get("Set-Cookie2") == "" || r2.Header.Get("Set-Cookie2") != "" {
		t.Errorf("Set-Cookie2: first %q, replay %q; want sent once, never replayed", r1.Header.Get("Set-Cookie2"), r2.Header.Get("Set-Cookie2"))
	}
	if r2.Header.Get("X-Hop") != "" || r2.Header.Get("Keep-Alive") != "" {
		t.Errorf("hop-by-hop fields replayed: %v", r2.Header)
	}
	exp := r1.Header.Get(idem.HeaderExpiresAt)
	if _, err := time.Parse(time.RFC3339, exp); err != nil || !strings.HasSuffix(exp, "Z") || exp != r2.Header.Get(idem.HeaderExpiresAt) {
		t.Errorf("Expires-At %q then %q", exp, r2.Header.Get(idem.HeaderExpiresAt))
	}
	if r2.Header.Get(idem.HeaderKey) != `"exact"` {
		t.Errorf("echoed key %q", r2.Header.Get(idem.HeaderKey))
	}
}

func TestInFlightDuplicateGets409(t *testing.T) {
	t.Parallel()
	release := newGate()
	defer release.open()
	started := make(chan struct{}, 1)
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		release.wait()
		created(w, r)
	}, nil)
	done := make(chan result)
	go func() { done <- b.post(body1, "k") }()
	<-started
	for range 5 {
		r := b.post(body1, "k")
		if r.status != 409 || r.problemCode(t) != idem.CodeRequestInProgress {
			t.Fatalf("duplicate: %d %s", r.status, r.body)
		}
		if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra < 1 {
			t.Fatalf("Retry-After %q", r.header.Get("Retry-After"))
		}
		if r.header.Get(idem.HeaderKey) != `"k"` || r.header.Get(idem.HeaderReplayed) != "false" {
			t.Errorf("409 headers %v", r.header)
		}
	}
	release.open()
	first := <-done
	if r := b.post(body1, "k"); !bytes.Equal(r.body, first.body) || r.header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("replay after completion: %d %s", r.status, r.body)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestParallelDuplicatesExecuteOnce(t *testing.T) {
	t.Parallel()
	// The first request to claim the key holds it until every other
	// duplicate has been answered, so all 50 really overlap.
	release := newGate()
	defer release.open()
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		release.wait()
		created(w, r)
	}, nil)
	const n = 50
	results := make([]result, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i] = b.post(body1, "parallel")
		}()
	}
	close(start)
	b.events.waitFor(t, idem.EventInFlight, n-1)
	release.open()
	wg.Wait()
	executed, conflicts := 0, 0
	for _, r := range results {
		switch r.status {
		case 201:
			executed++
		case 409:
			conflicts++
		default:
			t.Fatalf("unexpected %d %s", r.status, r.body)
		}
	}
	if executed != 1 || conflicts != n-1 {
		t.Fatalf("%d created and %d conflicts, want 1 and %d", executed, conflicts, n-1)
	}
	if calls := b.calls.Load(); calls != 1 {
		t.Fatalf("handler ran %d times for %d parallel duplicates", calls, n)
	}
}

// Rule 5: wait mode.

// signalStore reports every claim that finds the record in flight, so a
// test knows a duplicate is waiting. Without Watch it hides the store's
// Watcher, and wait mode must poll.
type signalStore struct {
	idemstore.Store
	inflight chan struct{}
}

func (s *signalStore) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	r, err := s.Store.Claim(ctx, p)
	if err == nil && r.Outcome == idemstore.ClaimInFlight {
		select {
		case s.inflight <- struct{}{}:
		default:
		}
	}
	return r, err
}

// signalWatcher is a signalStore that keeps the store's Watcher.
type signalWatcher struct{ *signalStore }

func (s signalWatcher) Watch(ctx context.Context, scope, key string) (<-chan struct{}, error) {
	return s.Store.(idemstore.Watcher).Watch(ctx, scope, key)
}

func TestWaitModeReplaysInsteadOf409(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"watcher", "polling"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			shared, _ := memstore.New(nil)
			sig := &signalStore{Store: shared, inflight: make(chan struct{}, 1)}
			var waiterStore idemstore.Store = sig
			if name == "watcher" {
				waiterStore = signalWatcher{sig}
			}
			release := newGate()
			defer release.open()
			started := make(chan struct{})
			// Two middlewares (as two processes would have) on one store.
			owner := setup(t, func(w http.ResponseWriter, r *http.Request) {
				close(started)
				release.wait()
				created(w, r)
			}, &options{store: shared})
			waiter := setup(t, created, &options{store: waiterStore, cfg: &idem.Config{Wait: 20 * time.Second}})
			done := make(chan result)
			go func() { done <- owner.post(body1, "w") }()
			<-started
			waited := make(chan result)
			go func() { waited <- waiter.post(body1, "w") }()
			<-sig.inflight // the duplicate found the owner running and waits
			release.open()
			first, second := <-done, <-waited
			if second.status != 201 || second.header.Get(idem.HeaderReplayed) != "true" || !bytes.Equal(first.body, second.body) {
				t.Fatalf("waiting duplicate: %d %s", second.status, second.body)
			}
			if waiter.calls.Load() != 0 {
				t.Fatal("the waiting duplicate executed")
			}
			waiter.events.mu.Lock()
			defer waiter.events.mu.Unlock()
			if len(waiter.events.events) != 1 || !waiter.events.events[0].Waited || waiter.events.events[0].Kind != idem.EventReplayed {
				t.Errorf("waiter events: %+v", waiter.events.events)
			}
		})
	}
}

func TestWaitModeGivesUpWith409(t *testing.T) {
	t.Parallel()
	release := newGate()
	defer release.open()
	started := make(chan struct{})
	shared, _ := memstore.New(nil)
	owner := setup(t, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		release.wait()
		created(w, r)
	}, &options{store: shared})
	waiter := setup(t, created, &options{store: shared, cfg: &idem.Config{Wait: 100 * time.Millisecond}})
	done := make(chan result)
	go func() { done <- owner.post(body1, "w") }()
	<-started
	if r := waiter.post(body1, "w"); r.status != 409 || r.header.Get("Retry-After") == "" {
		t.Fatalf("after the wait: %d", r.status)
	}
	release.open()
	<-done
}

// Rule 7: outcome policy.

func TestServerErrorsReleaseTheKey(t *testing.T) {
	t.Parallel()
	for _, status := range []int{500, 502, 503, 504, 408, 425, 429} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			t.Parallel()
			fail := true
			var mu sync.Mutex
			b := setup(t, func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				f := fail
				fail = false
				mu.Unlock()
				if f {
					http.Error(w, "transient", status)
					return
				}
				created(w, r)
			}, nil)
			r1 := b.post(body1, "k")
			if r1.status != status || r1.header.Get(idem.HeaderExpiresAt) != "" {
				t.Fatalf("first: %d, Expires-At %q", r1.status, r1.header.Get(idem.HeaderExpiresAt))
			}
			r2 := b.post(body1, "k")
			if r2.status != 201 || r2.header.Get(idem.HeaderReplayed) != "false" || b.calls.Load() != 2 {
				t.Fatalf("retry after %d: %d replayed=%s calls=%d", status, r2.status, r2.header.Get(idem.HeaderReplayed), b.calls.Load())
			}
		})
	}
}

func TestClientErrorsAreStored(t *testing.T) {
	t.Parallel()
	for _, status := range []int{400, 404, 409, 422} {
		b := setup(t, func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "deterministic", status)
		}, nil)
		b.post(body1, "k")
		r := b.post(body1, "k")
		if r.status != status || r.header.Get(idem.HeaderReplayed) != "true" || b.calls.Load() != 1 {
			t.Errorf("%d: replay %d %s, calls %d", status, r.status, r.header.Get(idem.HeaderReplayed), b.calls.Load())
		}
	}
}

func TestOutcomeFunc(t *testing.T) {
	t.Parallel()
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not found yet", 404)
	}, &options{cfg: &idem.Config{OutcomeFunc: func(status int) idem.Outcome {
		if status == 404 {
			return idem.OutcomeRelease
		}
		return idem.DefaultOutcome(status)
	}}})
	b.post(body1, "k")
	b.post(body1, "k")
	if n := b.calls.Load(); n != 2 {
		t.Fatalf("404 released by policy: handler ran %d times, want 2", n)
	}
}

func TestPanicReleasesAndRepanics(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	panics := true
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		p := panics
		panics = false
		mu.Unlock()
		if p {
			panic(http.ErrAbortHandler) // net/http closes the connection quietly
		}
		created(w, r)
	}, nil)
	req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/things", strings.NewReader(body1))
	req.Header.Set("Idempotency-Key", "k")
	if resp, err := b.srv.Client().Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the panic did not reach net/http: got %d", resp.StatusCode)
	}
	if r := b.post(body1, "k"); r.status != 201 || b.calls.Load() != 2 {
		t.Fatalf("retry after a panic: %d, calls %d", r.status, b.calls.Load())
	}
	if b.events.count(idem.EventReleased) != 1 {
		t.Errorf("released events: %d", b.events.count(idem.EventReleased))
	}
}

func TestClientGoneReleasesTheKey(t *testing.T) {
	t.Parallel()
	started := make(chan struct{})
	var first sync.Once
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		gone := false
		first.Do(func() { gone = true })
		if gone {
			close(started)
			<-r.Context().Done() // the client disconnects; the handler gives up
			return
		}
		created(w, r)
	}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.srv.URL+"/things", strings.NewReader(body1))
	req.Header.Set("Idempotency-Key", "k")
	errc := make(chan error)
	go func() {
		resp, err := b.srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-started
	cancel()
	<-errc
	b.events.waitFor(t, idem.EventReleased, 1)
	if r := b.post(body1, "k"); r.status != 201 || b.calls.Load() != 2 {
		t.Fatalf("retry after the client went away: %d, calls %d", r.status, b.calls.Load())
	}
}

func TestLargeResponseIsNeverExecutedTwice(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("x", 4096)
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(201)
		io.WriteString(w, big)
	}, &options{cfg: &idem.Config{MaxResponseBody: 1024}})
	first := b.post(body1, "k")
	if first.status != 201 || string(first.body) != big {
		t.Fatalf("first response: %d, %d bytes", first.status, len(first.body))
	}
	r := b.post(body1, "k")
	if r.status != 409 || r.problemCode(t) != idem.CodeResponseUnavailable || r.header.Get("Retry-After") != "" {
		t.Fatalf("retry of an unstored response: %d %s (Retry-After %q)", r.status, r.body, r.header.Get("Retry-After"))
	}
	if !bytes.Contains(r.body, []byte(`"originalStatus":201`)) {
		t.Errorf("problem does not name the original status: %s", r.body)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestFlushedResponseIsNeverExecutedTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "part 1;")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("Flush through the middleware: %v", err)
		}
		io.WriteString(w, "part 2")
	}, nil)
	first := b.post(body1, "k")
	if string(first.body) != "part 1;part 2" || first.header.Get(idem.HeaderReplayed) != "false" || first.header.Get(idem.HeaderExpiresAt) == "" {
		t.Fatalf("streamed response: %q %v", first.body, first.header)
	}
	if r := b.post(body1, "k"); r.status != 409 || r.problemCode(t) != idem.CodeResponseUnavailable {
		t.Fatalf("retry of a streamed response: %d %s", r.status, r.body)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

func TestResponseControllerDeadlinesPassThrough(t *testing.T) {
	t.Parallel()
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		if err := http.NewResponseController(w).SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Errorf("SetWriteDeadline through the middleware: %v", err)
		}
		created(w, r)
	}, nil)
	if r := b.post(body1, "k"); r.status != 201 {
		t.Fatal(r.status)
	}
}

// Rule 8: leases and fencing.

func TestInFlightAfterSeveralLeasePeriods(t *testing.T) {
	t.Parallel()
	release := newGate()
	defer release.open()
	started := make(chan struct{})
	lease := 150 * time.Millisecond
	b := setup(t, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		release.wait()
		created(w, r)
	}, &options{cfg: &idem.Config{Lease: lease}})
	done := make(chan result)
	go func() { done <- b.post(body1, "k") }()
	<-started
	// Six renewals at a third of a lease each: two full lease periods.
	b.events.waitFor(t, idem.EventRenewed, 6)
	if r := b.post(body1, "k"); r.status != 409 {
		t.Fatalf("duplicate after two lease periods: %d %s", r.status, r.body)
	}
	release.open()
	if r := <-done; r.status != 201 {
		t.Fatalf("owner: %d", r.status)
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

// failingRenew makes every renewal fail as a network partition would,
// while claims and completions still work.
type failingRenew struct{ idemstore.Store }

func (failingRenew) Renew(context.Context, idemstore.RenewParams) error {
	return errors.New("partitioned")
}

func TestStaleOwnerIsFenced(t *testing.T) {
	t.Parallel()
	shared, _ := memstore.New(nil)
	clock := newFakeClock()
	lease := 150 * time.Millisecond
	release := newGate()
	defer release.open()
	started := make(chan struct{})
	cancelled := make(chan error, 1)
	stale := setup(t, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		// The renewer cancels the context once the lease has run out
		// while renewals fail.
		<-r.Context().Done()
		cancelled <- context.Cause(r.Context())
		release.wait()
		// The handler ignores the cancellation and answers anyway.
		w.WriteHeader(201)
		io.WriteString(w, "stale result")
	}, &options{store: failingRenew{shared}, cfg: &idem.Config{Lease: lease, NowFunc: clock.Now}})
	successor := setup(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		io.WriteString(w, "successor result")
	}, &options{store: shared, cfg: &idem.Config{Lease: lease, NowFunc: clock.Now}})

	done := make(chan result)
	go func() { done <- stale.post(body1, "k") }()
	<-started
	// The stale owner cannot renew; its lease runs out.
	clock.Advance(lease * 2)
	r := successor.post(body1, "k")
	if r.status != 201 || string(r.body) != "successor result" {
		t.Fatalf("take-over: %d %s", r.status, r.body)
	}
	if successor.events.count(idem.EventExecuted) != 1 {
		t.Fatal("no executed event for the take-over")
	}
	// The stale owner's renewer notices and cancels its context.
	select {
	case cause := <-cancelled:
		if !errors.Is(cause, idemstore.ErrLeaseLost) {
			t.Errorf("stale handler's context cause: %v, want ErrLeaseLost", cause)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the stale owner's context was never cancelled")
	}
	release.open()
	s := <-done
	if s.status != 503 || s.problemCode(t) != idem.CodeLeaseLost {
		t.Fatalf("stale owner's answer: %d %s", s.status, s.body)
	}
	// The stored response is the successor's.
	if r := successor.post(body1, "k"); string(r.body) != "successor result" || r.header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("replay: %s", r.body)
	}
}

// Rule 9: expiry.

func TestExpiredKeyIsNew(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	b := setup(t, created, &options{cfg: &idem.Config{TTL: time.Hour, NowFunc: clock.Now}})
	first := b.post(body1, "k")
	exp, _ := time.Parse(time.RFC3339, first.header.Get(idem.HeaderExpiresAt))
	if !exp.Equal(clock.Now().Add(time.Hour)) {
		t.Errorf("Expires-At %v, want claim time plus TTL %v", exp, clock.Now().Add(time.Hour))
	}
	clock.Advance(59 * time.Minute)
	if r := b.post(body1, "k"); r.header.Get(idem.HeaderReplayed) != "true" {
		t.Fatal("no replay within the TTL")
	}
	clock.Advance(time.Minute)
	if r := b.post(body1, "k"); r.status != 201 || r.header.Get(idem.HeaderReplayed) != "false" || bytes.Equal(r.body, first.body) {
		t.Fatal("the key was not new after its TTL")
	}
	n, err := b.store.DeleteExpired(context.Background(), idemstore.DeleteExpiredParams{Limit: 10, Now: clock.Now().Add(2 * time.Hour)})
	if err != nil || n != 1 {
		t.Fatalf("DeleteExpired = %d, %v", n, err)
	}
}

// Rule 10: store failure.

type brokenStore struct{ idemstore.Store }

func (brokenStore) Claim(context.Context, idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	return idemstore.ClaimResult{}, errors.New("connection refused")
}

func TestStoreDownFailsClosed(t *testing.T) {
	t.Parallel()
	s, _ := memstore.New(nil)
	b := setup(t, created, &options{store: brokenStore{s}})
	r := b.post(body1, "k")
	if r.status != 503 || r.problemCode(t) != idem.CodeStoreUnavailable || r.header.Get("Retry-After") == "" {
		t.Fatalf("store down: %d %s", r.status, r.body)
	}
	if bytes.Contains(r.body, []byte("connection refused")) {
		t.Error("the store's error text leaks to the client")
	}
	if b.calls.Load() != 0 {
		t.Fatal("the handler ran without a claim")
	}
	if b.events.count(idem.EventStoreError) != 1 {
		t.Error("no store error event")
	}
	open := setup(t, created, &options{store: brokenStore{s}, cfg: &idem.Config{FailOpen: true}})
	if r := open.post(body1, "k"); r.status != 201 || open.calls.Load() != 1 {
		t.Fatalf("fail-open: %d", r.status)
	}
}

// Rule 12: errors and hooks.

func TestErrorFunc(t *testing.T) {
	t.Parallel()
	b := setup(t, created, &options{cfg: &idem.Config{ErrorFunc: func(w http.ResponseWriter, r *http.Request, p *idem.Problem) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(p.Status)
		fmt.Fprintf(w, "custom %s", p.Code)
	}}})
	r := b.post(body1)
	if r.status != 400 || string(r.body) != "custom "+idem.CodeKeyMissing {
		t.Fatalf("custom error: %d %q", r.status, r.body)
	}
}

func TestKeysAreRedactedInLogs(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	s, _ := memstore.New(nil)
	b := setup(t, created, &options{store: brokenStore{s}, cfg: &idem.Config{Logger: slog.New(slog.NewJSONHandler(&logs, nil))}})
	b.post(body1, "secret-order-4711")
	out := logs.String()
	if !strings.Contains(out, "store failed") || !strings.Contains(out, `"key":"`+idem.RedactKey("secret-order-4711")+`"`) {
		t.Fatalf("log lacks the failure or the redacted key: %s", out)
	}
	if strings.Contains(out, "secret-order-4711") {
		t.Fatalf("key logged in clear: %s", out)
	}
}

func TestRedactKey(t *testing.T) {
	t.Parallel()
	// sha256("k") = 8254c329a92850f6d539dd376f4816ee2764517da5e0235514af433164480d7a
	if got, want := idem.RedactKey("k"), "sha256:8254c329a928"; got != want {
		t.Errorf("RedactKey(k) = %q, want %q", got, want)
	}
	if idem.RedactKey("k") == idem.RedactKey("K") {
		t.Error("distinct keys redact alike")
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestObserverSeesEveryOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, created, nil)
	b.post(body1)              // rejected
	b.post(body1, "k")         // executed
	b.post(body1, "k")         // replayed
	b.post(`{"other":1}`, "k") // mismatch
	for kind, want := range map[idem.EventKind]int{
		idem.EventRejected: 1, idem.EventExecuted: 1, idem.EventReplayed: 1, idem.EventMismatch: 1,
	} {
		if got := b.events.count(kind); got != want {
			t.Errorf("%v events: %d, want %d", kind, got, want)
		}
	}
	b.events.mu.Lock()
	defer b.events.mu.Unlock()
	for _, e := range b.events.events {
		if e.Operation != "POST /things" {
			t.Errorf("%v event with operation %q", e.Kind, e.Operation)
		}
	}
}
