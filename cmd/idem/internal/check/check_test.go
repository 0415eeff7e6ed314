package check_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/check"
	"github.com/idemhq/idem/memstore"
)

const payload = `{"amount":2599,"currency":"USD","note":"check"}`

// payments is the operation behind every test server: each execution
// creates a payment with a new id, so that bodies tell executions apart.
type payments struct {
	n         atomic.Int64
	failFirst bool // the first execution fails with 503, as a flaky dependency would
}

func (p *payments) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := p.n.Add(1)
	if p.failFirst && n == 1 {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, `{"title":"payment provider unavailable","status":503}`)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":"pay_%d"}`, n)
}

// newIdemServer is a correct endpoint: idem's middleware on memstore, with
// records scoped by the Authorization field.
func newIdemServer(t *testing.T, p *payments, tls bool) *httptest.Server {
	t.Helper()
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, &idem.Config{
		TenantFunc: func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handle(p))
	var srv *httptest.Server
	if tls {
		srv = httptest.NewTLSServer(mux)
	} else {
		srv = httptest.NewServer(mux)
	}
	t.Cleanup(srv.Close)
	return srv
}

func options(url string) check.Options {
	return check.Options{
		URL:                 url + "/payments",
		Body:                []byte(payload),
		Headers:             http.Header{"Authorization": {"Bearer tenant-a"}},
		SecondTenantHeaders: http.Header{"Authorization": {"Bearer tenant-b"}},
	}
}

func run(t *testing.T, o check.Options) *check.Report {
	t.Helper()
	rep, err := check.Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if testing.Verbose() {
		var b strings.Builder
		rep.WriteText(&b)
		t.Log("\n" + b.String())
	}
	return rep
}

func wantAllPass(t *testing.T, rep *check.Report) {
	t.Helper()
	if len(rep.Checks) != len(check.Names()) {
		t.Errorf("%d checks, want %d", len(rep.Checks), len(check.Names()))
	}
	for _, c := range rep.Checks {
		if c.Status != check.Pass {
			t.Errorf("%s: %s %s\n\t%s", c.Name, c.Status, c.Reason, strings.Join(c.Details, "\n\t"))
		}
	}
	if rep.Failed() {
		t.Error("Failed() is true")
	}
}

func TestCorrectServerPasses(t *testing.T) {
	t.Parallel()
	t.Run("http", func(t *testing.T) {
		t.Parallel()
		p := &payments{}
		srv := newIdemServer(t, p, false)
		rep := run(t, options(srv.URL))
		wantAllPass(t, rep)
		// 7 executions: first request, key forms, JSON, mismatch, both
		// tenants, and one of the concurrent duplicates.
		if n := p.n.Load(); n != 7 {
			t.Errorf("%d executions, want 7", n)
		}
	})
	t.Run("https", func(t *testing.T) {
		t.Parallel()
		srv := newIdemServer(t, &payments{}, true)
		o := options(srv.URL)
		o.Client = srv.Client() // trusts the test certificate, also for raw requests
		wantAllPass(t, run(t, o))
	})
	t.Run("flaky handler", func(t *testing.T) {
		t.Parallel()
		// idem releases a 5xx, so the retry of the failed first request
		// executes and succeeds.
		srv := newIdemServer(t, &payments{failFirst: true}, false)
		rep := run(t, options(srv.URL))
		wantAllPass(t, rep)
		if c, _ := rep.Check("first-request"); !strings.Contains(c.Reason, "after 1 retry") {
			t.Errorf("first-request: %s", c.Reason)
		}
	})
	t.Run("duplicates in flight", func(t *testing.T) {
		t.Parallel()
		// Each execution waits until its duplicates have been answered 409
		// (or 300 ms, when it has none), so that the concurrency check sees
		// in-flight conflicts rather than replays.
		const n = 10
		g := &conflictGate{want: n - 1, n: map[string]int{}, full: map[string]chan struct{}{}}
		store, err := memstore.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		mw, err := idem.NewMiddleware(store, &idem.Config{
			TenantFunc: func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
		})
		if err != nil {
			t.Fatal(err)
		}
		p := &payments{}
		h := mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			timer := time.NewTimer(300 * time.Millisecond)
			defer timer.Stop()
			select {
			case <-g.done(r.Header.Get("Idempotency-Key")):
			case <-timer.C:
			}
			p.ServeHTTP(w, r)
		}))
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(&conflictWriter{ResponseWriter: w, g: g, key: r.Header.Get("Idempotency-Key")}, r)
		}))
		t.Cleanup(srv.Close)
		o := options(srv.URL)
		o.Concurrency = n
		rep := run(t, o)
		wantAllPass(t, rep)
		if c, _ := rep.Check("concurrent-duplicates"); !strings.Contains(c.Reason, fmt.Sprintf("%d× 409", n-1)) {
			t.Errorf("concurrent-duplicates: %s", c.Reason)
		}
	})
	t.Run("explicit variant", func(t *testing.T) {
		t.Parallel()
		srv := newIdemServer(t, &payments{}, false)
		o := options(srv.URL)
		o.Variant = []byte(`{"amount":1,"currency":"EUR"}`)
		wantAllPass(t, run(t, o))
	})
}

// conflictGate counts the 409 answers per key and signals when a key has
// had want of them.
type conflictGate struct {
	want int
	mu   sync.Mutex
	n    map[string]int
	full map[string]chan struct{}
}

func (g *conflictGate) done(key string) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.chanLocked(key)
}

func (g *conflictGate) chanLocked(key string) chan struct{} {
	ch, ok := g.full[key]
	if !ok {
		ch = make(chan struct{})
		g.full[key] = ch
	}
	return ch
}

func (g *conflictGate) conflict(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.n[key]++
	if g.n[key] == g.want {
		close(g.chanLocked(key))
	}
}

// conflictWriter tells the gate about each 409 sent for its key.
type conflictWriter struct {
	http.ResponseWriter
	g   *conflictGate
	key string
}

func (w *conflictWriter) WriteHeader(code int) {
	if code == http.StatusConflict {
		w.g.conflict(w.key)
	}
	w.ResponseWriter.WriteHeader(code)
}

// flaws are the defects of a naive idempotency layer.
type flaws struct {
	acceptsMissingKey bool // runs requests without a key
	noFingerprint     bool // replays the stored response for any payload
	noInFlight        bool // records a key only after its execution
	stores5xx         bool // stores failures like successes
	unscoped          bool // one key space for every tenant
	plainErrors       bool // errors in text/plain
	badExpiry         bool // advertises an expiry that is not RFC 3339
}

// naive is a small hand-written idempotency layer with switchable flaws;
// without flaws it behaves as the draft asks (so that each flaw alone is
// what the checker catches).
type naive struct {
	flaws
	next http.Handler

	mu      sync.Mutex
	records map[string]*naiveRecord
	// waiting holds, with noInFlight, a channel per key on which the first
	// execution waits for a duplicate to arrive: it makes the race that
	// the flaw loses certain instead of likely.
	waiting map[string]chan struct{}
}

type naiveRecord struct {
	fingerprint string
	done        bool
	status      int
	header      http.Header
	body        []byte
}

func newNaiveServer(t *testing.T, f flaws, p *payments) *httptest.Server {
	t.Helper()
	n := &naive{flaws: f, next: p, records: map[string]*naiveRecord{}, waiting: map[string]chan struct{}{}}
	srv := httptest.NewServer(n)
	t.Cleanup(srv.Close)
	return srv
}

func (n *naive) fail(w http.ResponseWriter, status int, title string) {
	if n.plainErrors {
		http.Error(w, title, status)
		return
	}
	w.Header().Set("Content-Type", "application/problem+json")
	if status == http.StatusConflict {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"title": title, "status": status})
}

func (n *naive) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	values := r.Header.Values("Idempotency-Key")
	if len(values) == 0 {
		if n.acceptsMissingKey {
			n.next.ServeHTTP(w, r)
			return
		}
		n.fail(w, http.StatusBadRequest, "Idempotency-Key is required")
		return
	}
	key, ok := naiveParseKey(values)
	if !ok {
		n.fail(w, http.StatusBadRequest, "Idempotency-Key is invalid")
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		n.fail(w, http.StatusBadRequest, "unreadable body")
		return
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		n.fail(w, http.StatusBadRequest, "invalid JSON")
		return
	}
	canonical, _ := json.Marshal(v) // sorted object members
	fp := string(canonical)
	scope := key
	if !n.unscoped {
		scope = r.Header.Get("Authorization") + "\n" + key
	}
	w.Header().Set("Idempotency-Key", `"`+key+`"`)
	if n.badExpiry {
		w.Header().Set("Idempotency-Key-Expires-At", "tomorrow")
	}

	n.mu.Lock()
	if rec, ok := n.records[scope]; ok {
		n.mu.Unlock()
		switch {
		case !n.noFingerprint && rec.fingerprint != fp:
			n.fail(w, http.StatusUnprocessableEntity, "Idempotency-Key reused with another payload")
		case !rec.done:
			n.fail(w, http.StatusConflict, "in progress")
		default:
			for k, vs := range rec.header {
				w.Header()[k] = vs
			}
			w.Header().Set("Idempotency-Replayed", "true")
			w.WriteHeader(rec.status)
			w.Write(rec.body)
		}
		return
	}
	if n.noInFlight {
		n.raceWithDuplicate(scope) // unlocks
	} else {
		n.records[scope] = &naiveRecord{fingerprint: fp}
		n.mu.Unlock()
	}

	rec := httptest.NewRecorder()
	r.Body = io.NopCloser(bytes.NewReader(body))
	n.next.ServeHTTP(rec, r)
	n.mu.Lock()
	if rec.Code >= 500 && !n.stores5xx {
		delete(n.records, scope)
	} else {
		n.records[scope] = &naiveRecord{fingerprint: fp, done: true, status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
	}
	n.mu.Unlock()
	for k, vs := range rec.Header() {
		w.Header()[k] = vs
	}
	w.Header().Set("Idempotency-Replayed", "false")
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

// raceWithDuplicate is called with n.mu held and releases it. The first
// request for a scope waits until a duplicate also finds no record (or
// 300 ms pass, for requests that have no duplicate), so that duplicates
// that arrive together all execute, as they may without in-flight records.
func (n *naive) raceWithDuplicate(scope string) {
	if ch, ok := n.waiting[scope]; ok {
		delete(n.waiting, scope)
		close(ch)
		n.mu.Unlock()
		return
	}
	ch := make(chan struct{})
	n.waiting[scope] = ch
	n.mu.Unlock()
	t := time.NewTimer(300 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
		n.mu.Lock()
		if n.waiting[scope] == ch {
			delete(n.waiting, scope)
		}
		n.mu.Unlock()
	}
}

// naiveParseKey accepts one field holding "key" or key, printable ASCII,
// 1 to 255 characters, no list.
func naiveParseKey(values []string) (string, bool) {
	if len(values) != 1 {
		return "", false
	}
	v := strings.TrimSpace(values[0])
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	if v == "" || len(v) > 255 || strings.ContainsAny(v, `,"`) {
		return "", false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return "", false
		}
	}
	return v, true
}

// Each flaw is caught by the check made for it, with FAIL (or WARN for
// the departures that do not duplicate work), and by no other check.
func TestDefectiveServers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		flaws     flaws
		failFirst bool
		fail      string // the check that must fail
		warn      string // or the check that must warn
		why       string // in its reason
	}{
		{name: "no flaws"},
		{name: "accepts missing key", flaws: flaws{acceptsMissingKey: true}, fail: "missing-key", why: "executed without an Idempotency-Key"},
		{name: "no fingerprint", flaws: flaws{noFingerprint: true}, fail: "payload-mismatch", why: "not fingerprinted"},
		{name: "no in-flight detection", flaws: flaws{noInFlight: true}, fail: "concurrent-duplicates", why: "got 2 distinct success responses"},
		{name: "5xx stored", flaws: flaws{stores5xx: true}, failFirst: true, fail: "first-request", why: "503 was stored and replayed"},
		{name: "keys not scoped by tenant", flaws: flaws{unscoped: true}, fail: "tenant-isolation", why: "not scoped by tenant"},
		{name: "text/plain errors", flaws: flaws{plainErrors: true}, warn: "problem-details", why: "not application/problem+json"},
		{name: "bad expiry", flaws: flaws{badExpiry: true}, fail: "expiry", why: "not an RFC 3339 time"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newNaiveServer(t, tc.flaws, &payments{failFirst: tc.failFirst})
			rep := run(t, options(srv.URL))
			for _, c := range rep.Checks {
				want := check.Pass
				switch c.Name {
				case tc.fail:
					want = check.Fail
				case tc.warn:
					want = check.Warn
				case "expiry":
					want = check.Skip // the naive server advertises no expiry
				case "replay":
					if tc.flaws.stores5xx {
						want = check.Skip // needs the first request
					}
				}
				if c.Status != want {
					t.Errorf("%s: %s (%s), want %s\n\t%s", c.Name, c.Status, c.Reason, want, strings.Join(c.Details, "\n\t"))
				}
				if want != check.Pass && want != check.Skip && !strings.Contains(c.Reason, tc.why) {
					t.Errorf("%s: reason %q does not say %q", c.Name, c.Reason, tc.why)
				}
			}
			if rep.Failed() != (tc.fail != "") {
				t.Errorf("Failed() = %v", rep.Failed())
			}
		})
	}
}

// A server that answers every request with the same body and marks no
// replays gives the checker nothing to tell replays from executions by:
// the checks that rely on it say so instead of passing.
func TestIndistinguishableBodies(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, &idem.Config{
		TenantFunc: func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"ok":true}`)
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(stripMarker{w}, r)
	}))
	t.Cleanup(srv.Close)
	rep := run(t, options(srv.URL))
	for _, name := range []string{"replay", "concurrent-duplicates", "tenant-isolation"} {
		if c, _ := rep.Check(name); c.Status != check.Warn || !strings.Contains(c.Reason, "inconclusive") {
			t.Errorf("%s: %s %s, want an inconclusive WARN", name, c.Status, c.Reason)
		}
	}
	if rep.Failed() {
		t.Error("Failed() is true for a correct server")
	}
}

// stripMarker removes idem's replay marker from the response.
type stripMarker struct{ http.ResponseWriter }

func (s stripMarker) WriteHeader(code int) {
	s.Header().Del("Idempotency-Replayed")
	s.ResponseWriter.WriteHeader(code)
}

func (s stripMarker) Write(b []byte) (int, error) {
	s.Header().Del("Idempotency-Replayed")
	return s.ResponseWriter.Write(b)
}

func TestRunErrors(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now
	for name, o := range map[string]check.Options{
		"no URL":      {},
		"scheme":      {URL: "ftp://example.com/x"},
		"no host":     {URL: "http:///x"},
		"concurrency": {URL: "http://127.0.0.1:1/", Concurrency: 1},
		"timeout":     {URL: "http://127.0.0.1:1/", Timeout: -1},
		"unreachable": {URL: url + "/payments", Timeout: 2 * time.Second},
	} {
		if rep, err := check.Run(context.Background(), o); err == nil || rep != nil {
			t.Errorf("%s: report %v, error %v; want an error alone", name, rep, err)
		}
	}
}

func TestCancelledRun(t *testing.T) {
	t.Parallel()
	srv := newIdemServer(t, &payments{}, false)
	ctx, cancel := context.WithCancel(context.Background())
	o := options(srv.URL)
	// Cancel when the second check sends its first request.
	var calls atomic.Int64
	o.Client = &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if calls.Add(1) == 2 {
			cancel()
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	rep, err := check.Run(ctx, o)
	if !errors.Is(err, context.Canceled) || rep == nil || len(rep.Checks) != 1 || rep.Checks[0].Status != check.Pass {
		t.Fatalf("report %+v, error %v: want the first check alone and context.Canceled", rep, err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestReportOutput(t *testing.T) {
	t.Parallel()
	srv := newNaiveServer(t, flaws{noFingerprint: true}, &payments{})
	rep := run(t, options(srv.URL))

	var text bytes.Buffer
	rep.WriteText(&text)
	out := text.String()
	for _, want := range []string{
		"idem check POST " + srv.URL + "/payments",
		"PASS  missing-key ",
		"FAIL  payload-mismatch ",
		"not fingerprinted",
		"FAIL: 9 passed, 1 failed, 0 warnings, 1 skipped",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text report lacks %q:\n%s", want, out)
		}
	}
	if lines := strings.Count(out, "\n"); lines > 30 {
		t.Errorf("text report has %d lines:\n%s", lines, out)
	}

	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back check.Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Checks) != len(rep.Checks) || back.URL != rep.URL || !back.Failed() {
		t.Errorf("JSON round trip lost data: %s", js.String())
	}
}

// countHandler answers GET with {"count":N}, N the executions of p.
func countHandler(p *payments) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"count":%d}`, p.n.Load())
	})
}

// With --count-url, a correct endpoint passes every check, each with its
// executions verified by the count.
func TestCountURLVerifiesExecutions(t *testing.T) {
	t.Parallel()
	p := &payments{}
	api := newIdemServer(t, p, false)
	counter := httptest.NewServer(countHandler(p))
	t.Cleanup(counter.Close)
	o := options(api.URL)
	o.CountURL = counter.URL
	rep := run(t, o)
	wantAllPass(t, rep)
	for _, name := range []string{"missing-key", "first-request", "replay", "concurrent-duplicates", "tenant-isolation"} {
		if c, _ := rep.Check(name); !strings.Contains(c.Reason, "executions verified") {
			t.Errorf("%s: %s", name, c.Reason)
		}
	}
}

// cachingServer runs the operation on every request with a key but answers
// with the first response for that key, marked as a replay: its responses
// look idempotent while its side effects are not.
type cachingServer struct {
	p     *payments
	mu    sync.Mutex
	cache map[string][]byte
}

func (s *cachingServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" || strings.ContainsAny(key, ",") || len(r.Header.Values("Idempotency-Key")) > 1 {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"title":"bad key","status":400}`)
		return
	}
	rec := httptest.NewRecorder()
	s.p.ServeHTTP(rec, r) // the side effect, every time
	scope := r.Header.Get("Authorization") + "\x00" + strings.Trim(key, `"`)
	s.mu.Lock()
	body, cached := s.cache[scope]
	if !cached {
		body = rec.Body.Bytes()
		s.cache[scope] = body
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Idempotency-Replayed", fmt.Sprint(cached))
	w.WriteHeader(http.StatusCreated)
	w.Write(body)
}

// A server that executes every request but answers the cached body passes
// the replay and concurrency checks on responses alone ("one distinct
// response"); the count at --count-url shows the executions and fails them.
func TestCountURLCatchesHiddenExecutions(t *testing.T) {
	t.Parallel()
	p := &payments{}
	api := httptest.NewServer(&cachingServer{p: p, cache: map[string][]byte{}})
	t.Cleanup(api.Close)
	counter := httptest.NewServer(countHandler(p))
	t.Cleanup(counter.Close)

	o := options(api.URL)
	rep := run(t, o)
	for _, name := range []string{"replay", "concurrent-duplicates"} {
		if c, _ := rep.Check(name); c.Status != check.Pass {
			t.Fatalf("without --count-url %s: %s %s (the responses alone look right)", name, c.Status, c.Reason)
		}
	}
	if c, _ := rep.Check("concurrent-duplicates"); !strings.Contains(c.Reason, "one distinct response") {
		t.Errorf("concurrent-duplicates says more than it saw: %s", c.Reason)
	}

	o.CountURL = counter.URL
	rep = run(t, o)
	for _, name := range []string{"replay", "concurrent-duplicates", "key-forms", "json-equivalence"} {
		c, _ := rep.Check(name)
		if c.Status != check.Fail || !strings.Contains(c.Reason, "--count-url") {
			t.Errorf("with --count-url %s: %s %s, want a FAIL by the count", name, c.Status, c.Reason)
		}
	}
	if c, _ := rep.Check("first-request"); c.Status != check.Pass {
		t.Errorf("first-request: %s %s", c.Status, c.Reason)
	}
}

// A count URL that does not answer {"count":N} stops the run before any
// request is sent.
func TestCountURLErrors(t *testing.T) {
	t.Parallel()
	p := &payments{}
	api := newIdemServer(t, p, false)
	for _, answer := range []string{`{"total":1}`, `not json`, `{"count":1.5}`} {
		bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, answer) }))
		o := options(api.URL)
		o.CountURL = bad.URL
		rep, err := check.Run(context.Background(), o)
		bad.Close()
		if err == nil || rep != nil || !strings.Contains(err.Error(), "count") {
			t.Errorf("count answer %s: report %v, error %v", answer, rep, err)
		}
	}
	if n := p.n.Load(); n != 0 {
		t.Errorf("%d executions", n)
	}
}
