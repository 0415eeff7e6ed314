package idemfiber_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemfiber"
	"github.com/idemhq/idem/memstore"
)

// serve runs app on a loopback port until the test ends and returns its URL.
func serve(t *testing.T, app *fiber.App) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true}) }()
	t.Cleanup(func() {
		if err := app.ShutdownWithTimeout(10 * time.Second); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return "http://" + ln.Addr().String()
}

func newMiddleware(t *testing.T, cfg *idem.Config) *idem.Middleware {
	t.Helper()
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

func handler(t *testing.T, mw *idem.Middleware, cfg *idemfiber.Config) fiber.Handler {
	t.Helper()
	h, err := idemfiber.New(mw, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// server is a Fiber app behind a real listener, with an order route that
// counts its executions.
type server struct {
	url     string
	runs    atomic.Int64
	after   atomic.Int64 // runs of a handler after the route's
	release chan struct{}
	entered chan struct{}
}

func newServer(t *testing.T, block bool) *server {
	t.Helper()
	mw := newMiddleware(t, nil)
	s := &server{}
	if block {
		s.release, s.entered = make(chan struct{}), make(chan struct{}, 16)
	}
	app := fiber.New()
	idm := handler(t, mw, nil)
	app.Post("/orders/:id", idm, func(c fiber.Ctx) error {
		n := s.runs.Add(1)
		if s.release != nil {
			s.entered <- struct{}{}
			<-s.release
		}
		info, ok := idem.InfoFromContext(c.Context())
		if !ok {
			return c.Status(http.StatusInternalServerError).SendString("no idempotent execution in the request context")
		}
		c.Set("X-Run", "run")
		c.Set("X-Scope", info.Scope)
		c.Append("X-Multi", "a")
		c.Append("X-Multi", "b")
		c.Cookie(&fiber.Cookie{Name: "order", Value: c.Params("id")})
		if err := c.Status(http.StatusCreated).JSON(fiber.Map{"order": c.Params("id"), "run": n}); err != nil {
			return err
		}
		return c.Next()
	}, func(fiber.Ctx) error { s.after.Add(1); return nil })
	app.Post("/status-only", idm, func(c fiber.Ctx) error {
		s.runs.Add(1)
		return c.SendStatus(http.StatusAccepted)
	})
	app.Post("/invalid", idm, func(fiber.Ctx) error {
		s.runs.Add(1)
		return fiber.NewError(http.StatusBadRequest, "no such item")
	})
	app.Post("/fails", idm, func(fiber.Ctx) error {
		s.runs.Add(1)
		return errors.New("database down")
	})
	app.Get("/orders/:id", idm, func(c fiber.Ctx) error { return c.SendString("read") })
	s.url = serve(t, app)
	return s
}

// client opens a connection per request: no idle connection keeps a
// test's server from shutting down.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

type reply struct {
	status int
	header http.Header
	body   string
}

func post(t *testing.T, url, key, body string) (reply, error) {
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{resp.StatusCode, resp.Header, string(b)}, err
}

func mustPost(t *testing.T, url, key, body string) reply {
	t.Helper()
	r, err := post(t, url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// fieldsBut returns h without the named fields, sorted into a comparable form.
func fieldsBut(h http.Header, skip ...string) []string {
	var out []string
	for k, vs := range h {
		if !slices.Contains(skip, k) {
			out = append(out, k+": "+strings.Join(vs, ", "))
		}
	}
	slices.Sort(out)
	return out
}

func TestExecuteReplayAndMismatch(t *testing.T) {
	t.Parallel()
	s := newServer(t, false)
	first := mustPost(t, s.url+"/orders/7", `"k-1"`, `{"item":"book","qty":1}`)
	if first.status != http.StatusCreated || first.header.Get(idem.HeaderReplayed) != "false" || first.header.Get("X-Run") != "run" ||
		first.header.Get(idem.HeaderKey) != `"k-1"` || first.header.Get(idem.HeaderExpiresAt) == "" {
		t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
	}
	if s.after.Load() != 1 {
		t.Errorf("the handler after the route's ran %d times", s.after.Load())
	}
	// The scope names Fiber's route pattern, not the path.
	if got := first.header.Get("X-Scope"); !strings.HasSuffix(got, "|POST /orders/:id") {
		t.Errorf("scope %q does not end with the route pattern", got)
	}
	// The same request, members reordered: a replay, byte for byte, with
	// every header field of the first response but Date,
	// Idempotency-Replayed and Set-Cookie (never replayed by default).
	again := mustPost(t, s.url+"/orders/7", `"k-1"`, `{"qty":1,"item":"book"}`)
	if again.status != first.status || again.body != first.body || again.header.Get(idem.HeaderReplayed) != "true" {
		t.Errorf("replay: %d %v %s, want %d %s", again.status, again.header, again.body, first.status, first.body)
	}
	if a, b := fieldsBut(first.header, "Date", idem.HeaderReplayed, "Set-Cookie"), fieldsBut(again.header, "Date", idem.HeaderReplayed); !slices.Equal(a, b) {
		t.Errorf("replayed header fields\n%q\nwant\n%q", b, a)
	}
	if first.header.Get("Set-Cookie") == "" {
		t.Error("the first response has no Set-Cookie")
	}
	if s.runs.Load() != 1 || s.after.Load() != 1 {
		t.Errorf("handlers ran %d and %d times, want once each", s.runs.Load(), s.after.Load())
	}
	// Another payload with the key: 422; another order of the route: 422.
	for _, c := range []struct{ path, body string }{{"/orders/7", `{"item":"pen"}`}, {"/orders/8", `{"item":"book","qty":1}`}} {
		r := mustPost(t, s.url+c.path, `"k-1"`, c.body)
		if r.status != http.StatusUnprocessableEntity || r.header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(r.body, idem.CodeKeyReused) || !strings.Contains(r.header.Get("Link"), "describedby") {
			t.Errorf("reused key on %s: %d %v %s", c.path, r.status, r.header, r.body)
		}
	}
	if r := mustPost(t, s.url+"/orders/7", "", `{}`); r.status != http.StatusBadRequest || !strings.Contains(r.body, idem.CodeKeyMissing) {
		t.Errorf("missing key: %d %s", r.status, r.body)
	}
	if r := mustPost(t, s.url+"/orders/7", `"a", "b"`, `{}`); r.status != http.StatusBadRequest || !strings.Contains(r.body, idem.CodeKeyInvalid) {
		t.Errorf("two keys: %d %s", r.status, r.body)
	}
	if r := mustPost(t, s.url+"/orders/7", `k-2`, `{"item":`); r.status != http.StatusBadRequest || !strings.Contains(r.body, idem.CodeBodyInvalid) {
		t.Errorf("invalid JSON: %d %s", r.status, r.body)
	}
	if s.runs.Load() != 1 {
		t.Errorf("handler ran %d times", s.runs.Load())
	}
	// GET needs no key and passes through.
	resp, err := client.Get(s.url + "/orders/7")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get(idem.HeaderReplayed) != "" {
		t.Errorf("GET: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestStatusWithoutBodyIsStored(t *testing.T) {
	t.Parallel()
	s := newServer(t, false)
	var first reply
	for i := range 2 {
		r := mustPost(t, s.url+"/status-only", "k", `{}`)
		if r.status != http.StatusAccepted || r.header.Get(idem.HeaderReplayed) != []string{"false", "true"}[i] {
			t.Errorf("attempt %d: %d %v", i, r.status, r.header)
		}
		if i == 0 {
			first = r
		} else if a, b := fieldsBut(first.header, "Date", idem.HeaderReplayed), fieldsBut(r.header, "Date", idem.HeaderReplayed); !slices.Equal(a, b) {
			t.Errorf("replayed header fields\n%q\nwant\n%q", b, a)
		}
	}
	if s.runs.Load() != 1 {
		t.Errorf("handler ran %d times", s.runs.Load())
	}
}

// An error a handler returns is answered by the app's ErrorHandler; that
// answer is what the outcome policy sees: a 400 is stored, a 500 released.
func TestHandlerErrors(t *testing.T) {
	t.Parallel()
	s := newServer(t, false)
	for i := range 2 {
		r := mustPost(t, s.url+"/invalid", "bad", `{}`)
		if r.status != http.StatusBadRequest || r.body != "no such item" || r.header.Get(idem.HeaderReplayed) != []string{"false", "true"}[i] {
			t.Errorf("invalid, attempt %d: %d %v %q", i, r.status, r.header, r.body)
		}
	}
	for i := range 2 {
		r := mustPost(t, s.url+"/fails", "down", `{}`)
		if r.status != http.StatusInternalServerError || r.header.Get(idem.HeaderReplayed) != "false" || r.header.Get(idem.HeaderExpiresAt) != "" {
			t.Errorf("failing, attempt %d: %d %v %q", i, r.status, r.header, r.body)
		}
	}
	if s.runs.Load() != 3 {
		t.Errorf("handlers ran %d times, want 3 (the 400 once, the 500 twice)", s.runs.Load())
	}
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	s := newServer(t, true)
	const n = 16
	replies := make([]reply, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); replies[0], errs[0] = post(t, s.url+"/orders/1", "dup", `{"item":"book"}`) }()
	select {
	case <-s.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the first request never reached the handler")
	}
	// While the first runs, every duplicate gets 409 with Retry-After at
	// once: they end while the first is still held.
	var dups sync.WaitGroup
	for i := 1; i < n; i++ {
		dups.Add(1)
		go func() { defer dups.Done(); replies[i], errs[i] = post(t, s.url+"/orders/1", "dup", `{"item":"book"}`) }()
	}
	dups.Wait()
	close(s.release)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := 1; i < n; i++ {
		if r := replies[i]; r.status != http.StatusConflict || r.header.Get("Retry-After") == "" || !strings.Contains(r.body, idem.CodeRequestInProgress) {
			t.Errorf("duplicate %d: %d %v %s", i, r.status, r.header, r.body)
		}
	}
	if replies[0].status != http.StatusCreated || s.runs.Load() != 1 {
		t.Errorf("first: %d; handler ran %d times", replies[0].status, s.runs.Load())
	}
}

// The Fiber hooks replace idem.Config's net/http ones, which New refuses.
func TestConfigHooks(t *testing.T) {
	t.Parallel()
	if _, err := idemfiber.New(newMiddleware(t, &idem.Config{TenantFunc: func(*http.Request) (string, error) { return "", nil }}), nil); err == nil ||
		!strings.Contains(err.Error(), "TenantFunc") {
		t.Errorf("a net/http TenantFunc: %v", err)
	}
	var runs atomic.Int64
	app := fiber.New()
	app.Post("/pay", handler(t, newMiddleware(t, nil), &idemfiber.Config{
		TenantFunc: func(c fiber.Ctx) (string, error) {
			if c.Get("X-Tenant") == "" {
				return "", &idem.Problem{Status: http.StatusUnauthorized, Code: "auth.missing", Title: "Who are you?"}
			}
			return c.Get("X-Tenant"), nil
		},
		OperationFunc: func(fiber.Ctx) string { return "payment" },
		ErrorFunc: func(c fiber.Ctx, p *idem.Problem) error {
			return c.Status(p.Status).SendString("custom " + p.Code)
		},
	}), func(c fiber.Ctx) error {
		runs.Add(1)
		info, _ := idem.InfoFromContext(c.Context())
		return c.SendString(info.Scope)
	})
	url := serve(t, app)
	send := func(tenant string) reply {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/pay", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "p-1")
		if tenant != "" {
			req.Header.Set("X-Tenant", tenant)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return reply{resp.StatusCode, resp.Header, string(b)}
	}
	if r := send(""); r.status != http.StatusUnauthorized || r.body != "custom auth.missing" {
		t.Errorf("no tenant: %d %q", r.status, r.body)
	}
	a, b := send("acme"), send("globex")
	if a.body == b.body || !strings.HasSuffix(a.body, "|payment") || runs.Load() != 2 {
		t.Errorf("two tenants, one key: %q and %q, %d runs", a.body, b.body, runs.Load())
	}
	if r := send("acme"); r.header.Get(idem.HeaderReplayed) != "true" || r.body != a.body {
		t.Errorf("replay for acme: %v %q", r.header, r.body)
	}
}

// A streamed body is sent as it is produced and cannot be stored: the
// record completes as unreplayable, and a retry gets 409
// idempotency.response_unavailable, never a second execution.
func TestStreamedBodyIsNotReplayed(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	app := fiber.New()
	app.Post("/export", handler(t, newMiddleware(t, nil), nil), func(c fiber.Ctx) error {
		runs.Add(1)
		return c.SendStreamWriter(func(w *bufio.Writer) {
			_, _ = w.WriteString("part 1\n")
			_ = w.Flush()
			_, _ = w.WriteString("part 2\n")
		})
	})
	url := serve(t, app)
	first := mustPost(t, url+"/export", "s", `{}`)
	if first.status != http.StatusOK || first.body != "part 1\npart 2\n" {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	again := mustPost(t, url+"/export", "s", `{}`)
	if again.status != http.StatusConflict || !strings.Contains(again.body, idem.CodeResponseUnavailable) || runs.Load() != 1 {
		t.Errorf("retry: %d %s; handler ran %d times", again.status, again.body, runs.Load())
	}
}

// A response over idem.Config.MaxResponseBody goes to the first client in
// full and is not stored: a retry gets 409 idempotency.response_unavailable.
func TestLargeResponseIsNotReplayed(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	app := fiber.New()
	app.Post("/big", handler(t, newMiddleware(t, &idem.Config{MaxResponseBody: 10}), nil), func(c fiber.Ctx) error {
		runs.Add(1)
		return c.SendString("more than ten bytes")
	})
	url := serve(t, app)
	if first := mustPost(t, url+"/big", "b", `{}`); first.status != http.StatusOK || first.body != "more than ten bytes" {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	again := mustPost(t, url+"/big", "b", `{}`)
	if again.status != http.StatusConflict || !strings.Contains(again.body, idem.CodeResponseUnavailable) || runs.Load() != 1 {
		t.Errorf("retry: %d %s; handler ran %d times", again.status, again.body, runs.Load())
	}
}
