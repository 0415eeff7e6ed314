package idem_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
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

// testBundle is one test's server and what it observes.
type testBundle struct {
	t      *testing.T
	srv    *httptest.Server
	store  idemstore.Store
	calls  atomic.Int64
	events *eventLog
	clock  *fakeClock
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// eventLog records observer events and lets a test wait for one.
type eventLog struct {
	mu     sync.Mutex
	events []idem.Event
	notify chan struct{}
}

func newEventLog() *eventLog { return &eventLog{notify: make(chan struct{}, 1)} }

func (l *eventLog) Observe(_ context.Context, e idem.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
	select {
	case l.notify <- struct{}{}:
	default:
	}
}

func (l *eventLog) count(k idem.EventKind) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.events {
		if e.Kind == k {
			n++
		}
	}
	return n
}

// waitFor blocks until at least n events of kind k were observed.
func (l *eventLog) waitFor(t *testing.T, k idem.EventKind, n int) {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for l.count(k) < n {
		select {
		case <-l.notify:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %d %v events (have %d)", n, k, l.count(k))
		}
	}
}

type options struct {
	cfg   *idem.Config
	store idemstore.Store
	route string
}

// setup starts a server whose handler h sits behind the middleware on a
// ServeMux route (POST /things unless options say otherwise).
func setup(t *testing.T, h http.HandlerFunc, opt *options) *testBundle {
	t.Helper()
	if opt == nil {
		opt = &options{}
	}
	b := &testBundle{t: t, events: newEventLog(), clock: newFakeClock()}
	cfg := idem.Config{}
	if opt.cfg != nil {
		cfg = *opt.cfg
	}
	if cfg.Observer == nil {
		cfg.Observer = b.events
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	b.store = opt.store
	if b.store == nil {
		s, err := memstore.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		b.store = s
	}
	m, err := idem.NewMiddleware(b.store, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	route := opt.route
	if route == "" {
		route = "/things"
	}
	mux := http.NewServeMux()
	mux.Handle(route, m.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b.calls.Add(1)
		h(w, r)
	})))
	b.srv = httptest.NewServer(mux)
	t.Cleanup(b.srv.Close)
	return b
}

type result struct {
	status int
	header http.Header
	body   []byte
}

func (r result) problemCode(t *testing.T) string {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("status %d with Content-Type %q, want application/problem+json; body %s", r.status, ct, r.body)
	}
	var p struct {
		Type, Title, Detail, Code string
		Status                    int
	}
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	if p.Status != r.status || p.Title == "" || p.Type == "" || p.Code == "" {
		t.Fatalf("incomplete problem %+v for status %d", p, r.status)
	}
	return p.Code
}

// do sends a request; keys are given as the raw header values.
func (b *testBundle) do(method, path, body string, header http.Header, keys ...string) result {
	b.t.Helper()
	req, err := http.NewRequest(method, b.srv.URL+path, strings.NewReader(body))
	if err != nil {
		b.t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if len(keys) > 0 {
		req.Header["Idempotency-Key"] = keys
	}
	resp, err := b.srv.Client().Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return result{resp.StatusCode, resp.Header, data}
}

func (b *testBundle) post(body string, keys ...string) result {
	b.t.Helper()
	return b.do(http.MethodPost, "/things", body, nil, keys...)
}

// raw sends a hand-written request, for header forms Go's client refuses to
// send.
func (b *testBundle) raw(headerLines string) result {
	b.t.Helper()
	conn, err := net.Dial("tcp", b.srv.Listener.Addr().String())
	if err != nil {
		b.t.Fatal(err)
	}
	defer conn.Close()
	body := `{"a":1}`
	fmt.Fprintf(conn, "POST /things HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n%s", len(body), headerLines, body)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header, data}
}

// created answers 201 with a body unique to each execution.
func created(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/things/1")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"echo":%q}`, time.Now().UnixNano(), body)
}

const body1 = `{"amount":100,"currency":"USD"}`

// Rule 1: the key.

func TestKeyMissing(t *testing.T) {
	t.Parallel()
	b := setup(t, created, nil)
	r := b.post(body1)
	if r.status != 400 || r.problemCode(t) != idem.CodeKeyMissing {
		t.Fatalf("missing key: %d %s", r.status, r.body)
	}
	if b.calls.Load() != 0 {
		t.Fatal("handler ran without a key")
	}
	// PATCH also requires one; GET, PUT and DELETE pass through.
	if r := b.do(http.MethodPatch, "/things", body1, nil); r.status != 400 {
		t.Errorf("PATCH without key: %d", r.status)
	}
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		r := b.do(m, "/things", "", nil)
		if r.status != 201 || r.header.Get(idem.HeaderReplayed) != "" {
			t.Errorf("%s without key: %d, replayed header %q; want pass-through", m, r.status, r.header.Get(idem.HeaderReplayed))
		}
	}
}

func TestKeyInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t, created, nil)
	for name, keys := range map[string][]string{
		"two fields": {`"a"`, `"b"`},
		"list":       {`"a", "b"`},
		"bare list":  {`a,b`},
		"empty":      {``},
		"empty str":  {`""`},
		"too long":   {strings.Repeat("k", idem.MaxKeyLength+1)},
		"non-ASCII":  {`"ключ"`},
		"bad quote":  {`"abc`},
	} {
		r := b.post(body1, keys...)
		if r.status != 400 || r.problemCode(t) != idem.CodeKeyInvalid {
			t.Errorf("%s: %d %s", name, r.status, r.body)
		}
	}
	for name, line := range map[string]string{
		"control char": "Idempotency-Key: \"a\x01b\"\r\n",
		"bare control": "Idempotency-Key: a\x7fb\r\n",
		"two lines":    "Idempotency-Key: a\r\nIdempotency-Key: a\r\n",
	} {
		r := b.raw(line)
		if r.status != 400 {
			t.Errorf("%s: %d %s", name, r.status, r.body)
			continue
		}
		// net/http itself refuses control characters in fields with a
		// plain 400 before any handler runs; ParseKey's own tests cover
		// them too.
		if r.header.Get("Content-Type") == "application/problem+json" && r.problemCode(t) != idem.CodeKeyInvalid {
			t.Errorf("%s: %s", name, r.body)
		}
	}
	if n := b.calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times for invalid keys", n)
	}
}

func TestQuotedAndBareAreOneKey(t *testing.T) {
	t.Parallel()
	b := setup(t, created, nil)
	first := b.post(body1, `"k-1"`)
	second := b.post(body1, `k-1`)
	if first.status != 201 || second.status != 201 || !bytes.Equal(first.body, second.body) {
		t.Fatalf("quoted then bare: %d %s / %d %s", first.status, first.body, second.status, second.body)
	}
	if second.header.Get(idem.HeaderReplayed) != "true" || b.calls.Load() != 1 {
		t.Fatalf("bare form did not replay the quoted one (calls %d)", b.calls.Load())
	}
	if got := second.header.Get(idem.HeaderKey); got != `"k-1"` {
		t.Errorf("echoed key %q, want the structured field form", got)
	}
}

func TestValidateKeyFunc(t *testing.T) {
	t.Parallel()
	b := setup(t, created, &options{cfg: &idem.Config{ValidateKeyFunc: func(k string) error {
		if len(k) != 36 {
			return errors.New("the key must be a UUID")
		}
		return nil
	}}})
	r := b.post(body1, "short")
	if r.status != 400 || r.problemCode(t) != idem.CodeKeyInvalid || !bytes.Contains(r.body, []byte("UUID")) {
		t.Fatalf("validator: %d %s", r.status, r.body)
	}
	if r := b.post(body1, "8e03978e-40d5-43e8-bc93-6894a57f9324"); r.status != 201 {
		t.Fatalf("valid UUID: %d", r.status)
	}
}

func TestRequirementPerRoute(t *testing.T) {
	t.Parallel()
	required := setup(t, created, &options{cfg: &idem.Config{Requirement: idem.KeyRequired}})
	if r := required.do(http.MethodGet, "/things", "", nil); r.status != 400 {
		t.Errorf("KeyRequired GET without key: %d", r.status)
	}
	optional := setup(t, created, &options{cfg: &idem.Config{Requirement: idem.KeyOptional}})
	if r := optional.post(body1); r.status != 201 || r.header.Get(idem.HeaderReplayed) != "" {
		t.Errorf("KeyOptional without key: %d", r.status)
	}
	optional.post(body1, "opt")
	if r := optional.post(body1, "opt"); r.header.Get(idem.HeaderReplayed) != "true" {
		t.Errorf("KeyOptional with key did not replay")
	}
	off := setup(t, created, &options{cfg: &idem.Config{Requirement: idem.KeyOff}})
	off.post(body1, "k")
	off.post(body1, "k")
	if n := off.calls.Load(); n != 2 {
		t.Errorf("KeyOff: handler ran %d times, want 2", n)
	}
	methods := setup(t, created, &options{cfg: &idem.Config{RequiredMethods: []string{http.MethodPut}}})
	if r := methods.do(http.MethodPut, "/things", body1, nil); r.status != 400 {
		t.Errorf("RequiredMethods PUT without key: %d", r.status)
	}
	if r := methods.post(body1); r.status != 201 {
		t.Errorf("RequiredMethods POST without key: %d", r.status)
	}
}

// Rule 2: scope.

func TestTenantsAreIsolated(t *testing.T) {
	t.Parallel()
	b := setup(t, created, &options{cfg: &idem.Config{TenantFunc: func(r *http.Request) (string, error) {
		return r.Header.Get("Authorization"), nil
	}}})
	alice := b.do(http.MethodPost, "/things", body1, http.Header{"Authorization": {"Bearer alice"}}, "shared")
	bob := b.do(http.MethodPost, "/things", body1, http.Header{"Authorization": {"Bearer bob"}}, "shared")
	if alice.status != 201 || bob.status != 201 || bytes.Equal(alice.body, bob.body) {
		t.Fatalf("two tenants, one key: %s / %s", alice.body, bob.body)
	}
	if bob.header.Get(idem.HeaderReplayed) != "false" || b.calls.Load() != 2 {
		t.Fatal("the second tenant got the first tenant's response")
	}
	// A different payload from the other tenant is not a mismatch either.
	carol := b.do(http.MethodPost, "/things", `{"other":true}`, http.Header{"Authorization": {"Bearer carol"}}, "shared")
	if carol.status != 201 {
		t.Fatalf("third tenant: %d", carol.status)
	}
	again := b.do(http.MethodPost, "/things", body1, http.Header{"Authorization": {"Bearer alice"}}, "shared")
	if !bytes.Equal(again.body, alice.body) {
		t.Fatal("alice's replay is not alice's response")
	}
}

func TestTenantFuncError(t *testing.T) {
	t.Parallel()
	b := setup(t, created, &options{cfg: &idem.Config{TenantFunc: func(r *http.Request) (string, error) {
		if r.Header.Get("Authorization") == "" {
			return "", &idem.Problem{Status: 401, Code: "auth.missing", Title: "Authentication required"}
		}
		return "", errors.New("unknown tenant")
	}}})
	if r := b.post(body1, "k"); r.status != 401 || r.problemCode(t) != "auth.missing" {
		t.Errorf("TenantFunc *Problem: %d %s", r.status, r.body)
	}
	r := b.do(http.MethodPost, "/things", body1, http.Header{"Authorization": {"x"}}, "k")
	if r.status != 400 || r.problemCode(t) != idem.CodeScopeInvalid {
		t.Errorf("TenantFunc error: %d %s", r.status, r.body)
	}
}

func TestSameKeyOnAnotherOperationIsAnotherRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, created, &options{route: "/things/{id}"})
	first := b.do(http.MethodPost, "/things/a", body1, nil, "k")
	// Same operation, same request: one record.
	if r := b.do(http.MethodPost, "/things/a", body1, nil, "k"); r.header.Get(idem.HeaderReplayed) != "true" || !bytes.Equal(r.body, first.body) {
		t.Fatal("same operation did not replay")
	}
	// The operation is the route pattern; the path is part of the request.
	// Another id with the same key is another request for the same
	// operation: a reused key.
	if r := b.do(http.MethodPost, "/things/b", body1, nil, "k"); r.status != 422 || r.problemCode(t) != idem.CodeKeyReused {
		t.Fatalf("same key, same operation, another path: %d %s", r.status, r.body)
	}
	// Another method is another operation: a separate record, not a 422.
	p := b.do(http.MethodPatch, "/things/a", body1, nil, "k")
	if p.status != 201 || p.header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("same key on another operation: %d %s", p.status, p.body)
	}
	if n := b.calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

// gate blocks handlers until a test opens it. Tests defer open, so that a
// failing test never leaves a handler blocked and the server unable to
// close.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

func (g *gate) wait() { <-g.ch }
