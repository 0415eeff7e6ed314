package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
	"github.com/idemhq/idem/sqlitestore"
)

// newTestProxy serves a Proxy to up on a real loopback server, with
// records in a fresh memstore unless cfg names a store.
func newTestProxy(t *testing.T, up *upstream, cfg Config) *httptest.Server {
	t.Helper()
	if cfg.Store == nil {
		s, err := memstore.New(nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Store = s
	}
	if cfg.Upstream == nil {
		u, err := url.Parse(up.URL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Upstream = u
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	p, err := New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	return newGuardedServer(t, p, cfg.Logger)
}

// newGuardedServer serves h on a real loopback server behind the framing
// guard, as `idem proxy` serves its proxy, with idem's header limit.
func newGuardedServer(t *testing.T, h http.Handler, logger *slog.Logger) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.MaxHeaderBytes = 64 << 10
	srv.Listener = GuardFraming(srv.Config, srv.Listener, logger)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

func TestPassThroughIsUntouched(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Connection", "X-Hop")
		w.Header().Set("X-Hop", "must not reach the client")
		writeJSON(w, http.StatusOK, map[string]string{"path": r.URL.Path})
	})
	px := newTestProxy(t, up, Config{})
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		r := send(t, method, px.URL+"/things/1?x=1", `{"a":1}`,
			"Connection", "X-Client-Hop", "X-Client-Hop", "secret", "X-Forwarded-For", "6.6.6.6")
		if r.status != http.StatusOK {
			t.Fatalf("%s: %v", method, r)
		}
		for _, h := range []string{idem.HeaderKey, idem.HeaderReplayed, idem.HeaderExpiresAt} {
			if v := r.header.Get(h); v != "" {
				t.Errorf("%s: pass-through response has %s: %q", method, h, v)
			}
		}
		if r.header.Get("X-Hop") != "" {
			t.Errorf("%s: hop-by-hop response field reached the client", method)
		}
		got, body := up.last(t)
		if got.Method != method || got.URL.RequestURI() != "/things/1?x=1" || body != `{"a":1}` {
			t.Errorf("%s: upstream got %s %s %q", method, got.Method, got.URL.RequestURI(), body)
		}
		if got.Header.Get("X-Client-Hop") != "" {
			t.Errorf("%s: a field the client named in Connection was forwarded", method)
		}
		// The client's own X-Forwarded-For is replaced: it could be forged.
		if xff := got.Header.Get("X-Forwarded-For"); xff != "127.0.0.1" {
			t.Errorf("%s: X-Forwarded-For = %q", method, xff)
		}
		pu, _ := url.Parse(px.URL)
		if got.Header.Get("X-Forwarded-Host") != pu.Host || got.Header.Get("X-Forwarded-Proto") != "http" {
			t.Errorf("%s: X-Forwarded-Host/Proto = %q %q", method, got.Header.Get("X-Forwarded-Host"), got.Header.Get("X-Forwarded-Proto"))
		}
	}
}

func TestKeyMissingIs400AndNotForwarded(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	px := newTestProxy(t, up, Config{})
	for _, method := range []string{http.MethodPost, http.MethodPatch} {
		r := send(t, method, px.URL+"/payments", `{"amount":1}`)
		if r.status != http.StatusBadRequest || r.problemCode() != idem.CodeKeyMissing {
			t.Fatalf("%s without a key: %v", method, r)
		}
	}
	if n := up.total(); n != 0 {
		t.Fatalf("the upstream ran %d requests without a key", n)
	}
}

func TestReplayIsByteForByte(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Location", "/payments/7")
		w.Header().Add("X-Multi", "a")
		w.Header().Add("X-Multi", "b")
		writeJSON(w, http.StatusCreated, map[string]any{"id": 7, "n": n, "key": r.Header.Get(idem.HeaderKey)})
	})
	px := newTestProxy(t, up, Config{})
	key := newKey(t)
	// A key sent as a Structured Field string is forwarded as it came.
	sent := `"` + key + `"`
	first := send(t, http.MethodPost, px.URL+"/payments", `{"amount":100}`, idem.HeaderKey, sent)
	if first.status != http.StatusCreated || first.header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("first: %v", first)
	}
	got, _ := up.last(t)
	if v := got.Header.Values(idem.HeaderKey); len(v) != 1 || v[0] != sent {
		t.Fatalf("upstream got Idempotency-Key %q, want %q unchanged", v, sent)
	}
	for range 2 {
		again := send(t, http.MethodPost, px.URL+"/payments", `{"amount":100}`, idem.HeaderKey, sent)
		if again.status != first.status || again.body != first.body {
			t.Fatalf("replay differs:\nfirst %v\nagain %v", first, again)
		}
		if again.header.Get(idem.HeaderReplayed) != "true" {
			t.Fatalf("replay not marked: %v", again)
		}
		for _, h := range []string{"Content-Type", "Content-Length", "Location", "X-Upstream", idem.HeaderExpiresAt} {
			if again.header.Get(h) != first.header.Get(h) {
				t.Errorf("%s: replay %q, first %q", h, again.header.Get(h), first.header.Get(h))
			}
		}
		if m := again.header.Values("X-Multi"); len(m) != 2 || m[0] != "a" || m[1] != "b" {
			t.Errorf("X-Multi replayed as %q", m)
		}
	}
	if n := up.count(sent); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}

func TestKeyReusedWithAnotherPayloadIs422(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	px := newTestProxy(t, up, Config{})
	key := newKey(t)
	if r := send(t, http.MethodPost, px.URL+"/payments", `{"amount":1}`, idem.HeaderKey, key); r.status != http.StatusCreated {
		t.Fatal(r)
	}
	r := send(t, http.MethodPost, px.URL+"/payments", `{"amount":2}`, idem.HeaderKey, key)
	if r.status != http.StatusUnprocessableEntity || r.problemCode() != idem.CodeKeyReused {
		t.Fatalf("reused key: %v", r)
	}
	if n := up.count(key); n != 1 {
		t.Fatalf("upstream ran %d times", n)
	}
}

// TestScopeIsAHashOfTheCredential checks that the same key from two
// credentials names two records, and that the credential never reaches
// the store (records in a real SQLite file, searched byte by byte).
func TestScopeIsAHashOfTheCredential(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store, err := sqlitestore.Open(context.Background(), filepath.Join(dir, "records.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	up := newUpstream(t, nil)
	px := newTestProxy(t, up, Config{Store: store})
	key := newKey(t)
	alice, bob := "Bearer alice-secret-token-1", "Bearer bob-secret-token-2"
	a1 := send(t, http.MethodPost, px.URL+"/payments", `{}`, idem.HeaderKey, key, "Authorization", alice)
	b1 := send(t, http.MethodPost, px.URL+"/payments", `{}`, idem.HeaderKey, key, "Authorization", bob)
	a2 := send(t, http.MethodPost, px.URL+"/payments", `{}`, idem.HeaderKey, key, "Authorization", alice)
	if a1.status != 201 || b1.status != 201 || b1.header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("two clients, one key: %v / %v", a1, b1)
	}
	if a2.header.Get(idem.HeaderReplayed) != "true" || a2.body != a1.body {
		t.Fatalf("same client's retry: %v", a2)
	}
	if n := up.count(key); n != 2 {
		t.Fatalf("upstream ran %d times, want once per client", n)
	}
	for _, name := range []string{"records.db", "records.db-wal"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, secret := range []string{"alice-secret", "bob-secret"} {
			if bytes.Contains(b, []byte(secret)) {
				t.Fatalf("%s contains the credential %q", name, secret)
			}
		}
	}
}

// A protected request without its scope header cannot be told apart from
// another client's (cookie-authenticated users, say): it is refused before
// anything is claimed or forwarded, so two such clients never share a
// record. Requests that pass through (no key needed) are untouched.
func TestMissingScopeHeaderIsRefused(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	px := newTestProxy(t, up, Config{})
	key := newKey(t)
	for _, cookie := range []string{"session=alice", "session=bob"} {
		for _, auth := range []string{"", " "} {
			r := send(t, http.MethodPost, px.URL+"/payments", `{}`, idem.HeaderKey, key, "Cookie", cookie, "Authorization", auth)
			if r.status != http.StatusBadRequest || r.problemCode() != CodeScopeMissing || !strings.Contains(r.body, "Authorization") {
				t.Fatalf("%s without Authorization: %v, want 400 %s", cookie, r, CodeScopeMissing)
			}
		}
	}
	if n := up.total(); n != 0 {
		t.Fatalf("the upstream was called %d times", n)
	}
	// The key was not consumed.
	if r := send(t, http.MethodPost, px.URL+"/payments", `{}`, idem.HeaderKey, key); r.status != http.StatusCreated {
		t.Fatalf("with Authorization: %v", r)
	}
	if r := send(t, http.MethodGet, px.URL+"/payments", "", "Authorization", ""); r.status != http.StatusCreated {
		t.Fatalf("a GET passes through without a scope: %v", r)
	}
}

// A request that comes back to the proxy that forwarded it (an upstream
// that leads to the proxy itself) is answered 508 at its second pass; the
// forwarded request carries the proxy in Via.
func TestLoopIsDetected(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	self, err := url.Parse("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	store, _ := memstore.New(nil)
	p, err := New(&Config{Upstream: self, Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: p}}
	srv.Start()
	t.Cleanup(srv.Close)
	r := send(t, http.MethodGet, srv.URL+"/x", "")
	if r.status != http.StatusLoopDetected || r.problemCode() != CodeLoopDetected {
		t.Fatalf("looping GET: %v", r)
	}
	r = send(t, http.MethodPost, srv.URL+"/x", `{}`, idem.HeaderKey, newKey(t))
	if r.status != http.StatusLoopDetected {
		t.Fatalf("looping POST: %v", r)
	}

	up := newUpstream(t, nil)
	px := newTestProxy(t, up, Config{})
	send(t, http.MethodGet, px.URL+"/y", "", "Via", "1.1 other-proxy")
	req, _ := up.last(t)
	via := req.Header.Values("Via")
	if len(via) != 2 || via[0] != "1.1 other-proxy" || !strings.HasPrefix(via[1], "1.1 idem-") {
		t.Fatalf("the upstream got Via %q", via)
	}
}

func TestNoScopeSharesKeys(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	s := DefaultSettings()
	s.ScopeHeader = ""
	px := newTestProxy(t, up, Config{Defaults: s})
	key := newKey(t)
	send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key, "Authorization", "Bearer a")
	r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key, "Authorization", "Bearer b")
	if r.header.Get(idem.HeaderReplayed) != "true" || up.count(key) != 1 {
		t.Fatalf("without a scope the second client should replay: %v (upstream ran %d)", r, up.count(key))
	}
}

func TestUpstream5xxIsReleased(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "busy"})
			return
		}
		writeJSON(w, http.StatusCreated, map[string]int{"n": n})
	})
	px := newTestProxy(t, up, Config{})
	key := newKey(t)
	if r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key); r.status != 503 || r.header.Get(idem.HeaderExpiresAt) != "" {
		t.Fatalf("first: %v", r)
	}
	if r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key); r.status != 201 || r.header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("retry after 5xx: %v", r)
	}
	if r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key); r.status != 201 || r.header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("retry after success: %v", r)
	}
	if n := up.count(key); n != 2 {
		t.Fatalf("upstream ran %d times, want 2", n)
	}
}

func TestUnreachableUpstreamIs502AndReleases(t *testing.T) {
	t.Parallel()
	addr := closedAddr(t)
	u, _ := url.Parse("http://" + addr)
	px := newTestProxy(t, nil, Config{Upstream: u})
	key := newKey(t)
	r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key)
	if r.status != http.StatusBadGateway || r.problemCode() != CodeUpstreamUnreachable ||
		r.header.Get("Content-Type") != "application/problem+json" || r.header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("unreachable upstream: %v", r)
	}
	// Pass-through requests get the same answer.
	if g := send(t, http.MethodGet, px.URL+"/p", ""); g.status != http.StatusBadGateway || g.problemCode() != CodeUpstreamUnreachable {
		t.Fatalf("GET: %v", g)
	}
	ln := listenOn(t, addr)
	up := newUpstreamOn(t, ln, nil)
	if r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key); r.status != http.StatusCreated || r.header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("retry once the upstream is up: %v", r)
	}
	if up.count(key) != 1 {
		t.Fatal("upstream count")
	}
}

func TestUpstreamTimeoutIs504AndReleases(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			<-r.Context().Done() // never answers; the proxy gives up
			return
		}
		writeJSON(w, http.StatusCreated, map[string]int{"n": n})
	})
	s := DefaultSettings()
	s.UpstreamTimeout = 200 * time.Millisecond
	px := newTestProxy(t, up, Config{Defaults: s})
	key := newKey(t)
	r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key)
	if r.status != http.StatusGatewayTimeout || r.problemCode() != CodeUpstreamTimeout {
		t.Fatalf("timeout: %v", r)
	}
	if r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key); r.status != http.StatusCreated {
		t.Fatalf("retry after the timeout: %v", r)
	}
}

func TestRequestTooLargeIs413(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	s := DefaultSettings()
	s.MaxRequestBody = 16
	px := newTestProxy(t, up, Config{Defaults: s})
	r := send(t, http.MethodPost, px.URL+"/p", strings.Repeat("x", 17), idem.HeaderKey, newKey(t))
	if r.status != http.StatusRequestEntityTooLarge || r.problemCode() != idem.CodeRequestTooLarge {
		t.Fatalf("%v", r)
	}
	// Pass-through bodies are not bounded by the proxy.
	if g := send(t, http.MethodPut, px.URL+"/p", strings.Repeat("x", 100)); g.status != http.StatusCreated {
		t.Fatalf("PUT: %v", g)
	}
	if n := up.total(); n != 1 {
		t.Fatalf("upstream got %d requests", n)
	}
}

// TestChunkedResponseIsStored: an upstream answer without Content-Length
// makes ReverseProxy flush after every write; the proxy must still store
// it for replay instead of letting the flush send it unstored.
func TestChunkedResponseIsStored(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusOK)
		for range 3 {
			io.WriteString(w, "part ")
			w.(http.Flusher).Flush()
		}
	})
	px := newTestProxy(t, up, Config{})
	key := newKey(t)
	first := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key)
	again := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key)
	if first.body != "part part part " || again.body != first.body || again.header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("first %v\nagain %v", first, again)
	}
}

// TestEventStreamPassesThroughStreaming checks that a pass-through
// server-sent-events response reaches the client while the upstream is
// still writing it.
func TestEventStreamPassesThroughStreaming(t *testing.T) {
	t.Parallel()
	more := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-more:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: two\n\n")
	})
	px := newTestProxy(t, up, Config{})
	resp, err := testClient.Get(px.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "data: one\n" {
		t.Fatalf("first event: %q %v", line, err)
	}
	close(more) // only now may the upstream finish
	rest, _ := io.ReadAll(br)
	if string(rest) != "\ndata: two\n\n" {
		t.Fatalf("rest: %q", rest)
	}
}

func TestLargeResponseIsUnreplayableNotRerun(t *testing.T) {
	t.Parallel()
	big := strings.Repeat("y", 4096)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		io.WriteString(w, big)
	})
	s := DefaultSettings()
	s.MaxResponseBody = 1024
	px := newTestProxy(t, up, Config{Defaults: s})
	key := newKey(t)
	if r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key); r.status != 200 || r.body != big {
		t.Fatalf("first: %d, %d bytes", r.status, len(r.body))
	}
	r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key)
	if r.status != http.StatusConflict || r.problemCode() != idem.CodeResponseUnavailable || up.count(key) != 1 {
		t.Fatalf("retry: %v (upstream ran %d)", r, up.count(key))
	}
}

func TestRoutesFromConfigFile(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Path == "/conflict" {
			writeJSON(w, http.StatusConflict, map[string]int{"n": n})
			return
		}
		writeJSON(w, http.StatusCreated, map[string]int{"n": n})
	})
	file, err := ParseFile("routes.yaml", []byte(`
routes:
  "POST /webhooks/":
    key: "off"
  "/orders/{id}/refund":
    key: optional
  "PUT /things/{id}":
    key: required
  "POST /conflict":
    release_statuses: [409]
`), DefaultSettings())
	if err != nil {
		t.Fatal(err)
	}
	px := newTestProxy(t, up, Config{Routes: file.ProxyRoutes()})

	// key: off passes a POST without a key, and does not protect one with.
	if r := send(t, http.MethodPost, px.URL+"/webhooks/in", `{}`); r.status != 201 || r.header.Get(idem.HeaderReplayed) != "" {
		t.Fatalf("off: %v", r)
	}
	// key: optional protects only requests that carry one.
	if r := send(t, http.MethodPost, px.URL+"/orders/1/refund", `{}`); r.status != 201 || r.header.Get(idem.HeaderReplayed) != "" {
		t.Fatalf("optional without a key: %v", r)
	}
	key := newKey(t)
	send(t, http.MethodPost, px.URL+"/orders/1/refund", `{}`, idem.HeaderKey, key)
	if r := send(t, http.MethodPost, px.URL+"/orders/1/refund", `{}`, idem.HeaderKey, key); r.header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("optional with a key: %v", r)
	}
	// The route is the operation: the same key on another order is
	// another request, answered 422.
	if r := send(t, http.MethodPost, px.URL+"/orders/2/refund", `{}`, idem.HeaderKey, key); r.status != 422 {
		t.Fatalf("same key, other order: %v", r)
	}
	// A path in non-canonical form matches its route (here: required) and
	// is forwarded as sent, not redirected.
	if r := send(t, http.MethodPut, px.URL+"/things/x/../1", `{}`); r.status != 400 || r.problemCode() != idem.CodeKeyMissing {
		t.Fatalf("PUT without a key on a required route: %v", r)
	}
	// Routes not in the file use the defaults: GET passes, POST needs a key.
	if r := send(t, http.MethodGet, px.URL+"/things/1", ""); r.status != 201 || r.header.Get(idem.HeaderReplayed) != "" {
		t.Fatalf("GET: %v", r)
	}
	if r := send(t, http.MethodPost, px.URL+"/elsewhere", `{}`); r.status != 400 {
		t.Fatalf("POST elsewhere without a key: %v", r)
	}
	// The outcome policy releases 409 on its route.
	key2 := newKey(t)
	send(t, http.MethodPost, px.URL+"/conflict", `{}`, idem.HeaderKey, key2)
	if r := send(t, http.MethodPost, px.URL+"/conflict", `{}`, idem.HeaderKey, key2); r.header.Get(idem.HeaderReplayed) != "false" || up.count(key2) != 2 {
		t.Fatalf("released 409 should run again: %v (ran %d)", r, up.count(key2))
	}
}

func TestRouteMatching(t *testing.T) {
	t.Parallel()
	s, _ := memstore.New(nil)
	u, _ := url.Parse("http://127.0.0.1:1")
	p, err := New(&Config{Upstream: u, Store: s, Logger: slog.New(slog.DiscardHandler), Routes: []Route{
		{Pattern: "POST /payments", Settings: DefaultSettings()},
		{Pattern: "/orders/", Settings: DefaultSettings()},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ method, path, want string }{
		{"POST", "/payments", "POST /payments"},
		{"POST", "/x/../payments", "POST /payments"},
		{"GET", "/payments", ""},
		{"POST", "/orders", "/orders/"}, // the mux would redirect to /orders/
		{"POST", "/orders/1", "/orders/"},
		{"POST", "/other", ""},
	} {
		r := httptest.NewRequest(c.method, "http://proxy"+c.path, nil)
		r.URL.Path = c.path // keep dot segments
		if got := p.Route(r); got != c.want {
			t.Errorf("%s %s: route %q, want %q", c.method, c.path, got, c.want)
		}
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	s, _ := memstore.New(nil)
	u, _ := url.Parse("http://127.0.0.1:1")
	bad := DefaultSettings()
	bad.Lease = time.Millisecond
	for name, cfg := range map[string]*Config{
		"nil":          nil,
		"no store":     {Upstream: u},
		"ftp upstream": {Upstream: &url.URL{Scheme: "ftp", Host: "h"}, Store: s},
		"short lease":  {Upstream: u, Store: s, Defaults: bad},
		"bad pattern":  {Upstream: u, Store: s, Routes: []Route{{Pattern: "POST payments", Settings: DefaultSettings()}}},
		"conflict": {Upstream: u, Store: s, Routes: []Route{
			{Pattern: "/a/{x}", Settings: DefaultSettings()}, {Pattern: "/a/{y}", Settings: DefaultSettings()}}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}

// TestLeaseRenewedWhileUpstreamWorks: an upstream slower than several
// leases keeps its claim (the core renews it), so duplicates keep getting
// 409 and the request runs once.
func TestLeaseRenewedWhileUpstreamWorks(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	up := newUpstream(t, g.held)
	s := DefaultSettings()
	s.Lease = 150 * time.Millisecond
	px := newTestProxy(t, up, Config{Defaults: s})
	key := newKey(t)
	res := make(chan reply, 1)
	go func() {
		r, err := trySend(http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key)
		if err != nil {
			r = reply{status: -1, body: err.Error()}
		}
		res <- r
	}()
	up.waitHit(t)
	// Four leases must pass while the upstream works.
	for end := time.Now().Add(4 * s.Lease); time.Now().Before(end); {
		if r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key); r.status != http.StatusConflict {
			t.Fatalf("duplicate while the upstream works: %v", r)
		}
		time.Sleep(s.Lease / 3) // time has to pass
	}
	g.open()
	if r := <-res; r.status != http.StatusCreated {
		t.Fatalf("first: %v", r)
	}
	if c := up.count(key); c != 1 {
		t.Fatalf("upstream ran %d times", c)
	}
}

// TestClientGoneStillStores: a client that gives up while the upstream
// works must not make its retry run the request again: the proxy awaits
// the upstream's answer, stores it, and the retry replays it.
func TestClientGoneStillStores(t *testing.T) {
	t.Parallel()
	g := newGate(t)
	up := newUpstream(t, g.held)
	px := newTestProxy(t, up, Config{})
	key := newKey(t)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, px.URL+"/p", strings.NewReader(`{}`))
	req.Header.Set(idem.HeaderKey, key)
	req.Header.Set("Authorization", testCredential)
	req.Header.Set("Content-Type", "application/json")
	errc := make(chan error, 1)
	go func() {
		resp, err := testClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	up.waitHit(t)
	cancel()
	if err := <-errc; err == nil {
		t.Fatal("the cancelled client got an answer")
	}
	g.open()
	// The upstream's answer has to be stored.
	r := postWhileInProgress(t, px.URL+"/p", `{}`, key, 10*time.Second, 10*time.Millisecond)
	if r.status != http.StatusCreated || r.header.Get(idem.HeaderReplayed) != "true" || up.count(key) != 1 {
		t.Fatalf("retry after the client gave up: %v (upstream ran %d)", r, up.count(key))
	}
}

// TestUpgradePassesThrough: a protocol upgrade (as WebSocket uses) is
// tunnelled to the upstream.
func TestUpgradePassesThrough(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "upgrade expected", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		brw.WriteString("echo: " + line)
		brw.Flush()
	})
	px := newTestProxy(t, up, Config{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(px.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(conn, "hello\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo: hello\n" {
		t.Fatalf("tunnel: %q %v", line, err)
	}
}

// TestBrokenUpstreamBodyReleases: an upstream whose body breaks off after
// the status line gives no answer to store; the client's connection is
// closed and the key released, so the retry runs again.
func TestBrokenUpstreamBodyReleases(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "only ten..")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // drop the connection mid-body
		}
		writeJSON(w, http.StatusCreated, map[string]int{"n": n})
	})
	px := newTestProxy(t, up, Config{})
	key := newKey(t)
	if r, err := trySend(http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key); err == nil {
		t.Fatalf("a broken answer reached the client whole: %v", r)
	}
	r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key)
	if r.status != http.StatusCreated || r.header.Get(idem.HeaderReplayed) != "false" || up.count(key) != 2 {
		t.Fatalf("retry: %v (upstream ran %d)", r, up.count(key))
	}
}

// rawUpstream answers every request on a connection with the fixed bytes
// of resp (keepAlive responses first, then the last one), the way a server
// outside Go's control would: it can send a Connection field that names
// other fields along with close.
func rawUpstream(t *testing.T, keepAlive int, resp func(i int) string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for i := 0; i <= keepAlive; i++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					io.WriteString(c, resp(i))
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// A field the upstream names in its Connection field is connection-
// specific: never forwarded, stored or replayed, even when Connection also
// says close (which Go's client removes before the proxy sees it); and
// Set-Cookie2 is never replayed.
func TestConnectionFieldsWithCloseAreNotStored(t *testing.T) {
	t.Parallel()
	const body = `{"id":1}`
	// The first response on a connection keeps it alive and carries in its
	// body what looks like a header block; the second closes it.
	target := rawUpstream(t, 1, func(i int) string {
		if i == 0 {
			decoy := "HTTP/1.1 201 Created\r\nConnection: close, X-Other\r\n\r\n"
			return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", len(decoy), decoy)
		}
		return "HTTP/1.1 201 Created\r\n" +
			"Content-Type: application/json\r\n" +
			"Connection: X-Conn-Secret, close\r\n" +
			"Connection: x-hop\r\n" +
			"X-Conn-Secret: per-connection\r\n" +
			"X-Hop: 1\r\n" +
			"X-Other: kept\r\n" +
			"Set-Cookie2: legacy=1\r\n" +
			"Content-Length: " + fmt.Sprint(len(body)) + "\r\n\r\n" + body
	})
	u, _ := url.Parse(target)
	store, _ := memstore.New(nil)
	p, err := New(&Config{Upstream: u, Store: store, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)

	// One connection: a pass-through GET, then the protected POST on the
	// same upstream connection.
	if r := send(t, http.MethodGet, srv.URL+"/warm", ""); r.status != http.StatusOK {
		t.Fatalf("warm-up: %v", r)
	}
	key := newKey(t)
	first := send(t, http.MethodPost, srv.URL+"/p", `{}`, idem.HeaderKey, key)
	replay := send(t, http.MethodPost, srv.URL+"/p", `{}`, idem.HeaderKey, key)
	for name, r := range map[string]reply{"first": first, "replay": replay} {
		if r.status != http.StatusCreated || r.body != body {
			t.Fatalf("%s: %v", name, r)
		}
		for _, f := range []string{"X-Conn-Secret", "X-Hop", "Connection"} {
			if v := r.header.Values(f); len(v) > 0 {
				t.Errorf("%s carries %s: %q", name, f, v)
			}
		}
		if r.header.Get("X-Other") != "kept" {
			t.Errorf("%s lost X-Other, which Connection does not name: %v", name, r.header)
		}
	}
	if replay.header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("not a replay: %v", replay)
	}
	// The first client gets its cookie; whoever retries does not.
	if first.header.Get("Set-Cookie2") == "" || replay.header.Get("Set-Cookie2") != "" {
		t.Errorf("Set-Cookie2: first %q, replay %q", first.header.Get("Set-Cookie2"), replay.header.Get("Set-Cookie2"))
	}
}

// captureConn keeps exactly the last captureSize bytes read, whatever the
// sizes of the reads.
func TestCaptureConnKeepsTheLastBytes(t *testing.T) {
	t.Parallel()
	data := make([]byte, 3*captureSize+123)
	for i := range data {
		data[i] = byte(i * 7)
	}
	a, b := net.Pipe()
	go func() {
		defer a.Close()
		for off, step := 0, 1; off < len(data); step = step*3 + 1 {
			n := min(step%(2*captureSize)+1, len(data)-off)
			a.Write(data[off : off+n])
			off += n
		}
	}()
	c := &captureConn{Conn: b}
	buf := make([]byte, 2*captureSize+7)
	read := 0
	for {
		n, err := c.Read(buf)
		read += n
		if got, want := c.recent(), data[max(0, read-captureSize):read]; !bytes.Equal(got, want) {
			t.Fatalf("after %d bytes: kept %d bytes, not the last %d", read, len(got), len(want))
		}
		if err != nil {
			break
		}
	}
	if read != len(data) {
		t.Fatalf("read %d of %d", read, len(data))
	}
}
