package idemecho_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemecho"
	"github.com/idemhq/idem/memstore"
	"github.com/labstack/echo/v5"
)

// server is an echo server behind a real HTTP server, with an order route
// that counts its executions.
type server struct {
	url     string
	runs    atomic.Int64
	fails   atomic.Int64
	release chan struct{} // when set, the handler waits for it
	entered chan struct{}
	logged  chan int // statuses echo's outer response saw
}

func newServer(t *testing.T, block bool) *server {
	t.Helper()
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &server{logged: make(chan int, 64)}
	if block {
		s.release, s.entered = make(chan struct{}), make(chan struct{}, 16)
	}
	e := echo.New()
	// A logger-like middleware outside idem sees the status sent.
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c *echo.Context) error {
			err := next(c)
			r, uerr := echo.UnwrapResponse(c.Response())
			if uerr != nil {
				panic(uerr)
			}
			s.logged <- r.Status
			return err
		}
	})
	e.POST("/orders/:id", func(c *echo.Context) error {
		n := s.runs.Add(1)
		if s.release != nil {
			s.entered <- struct{}{}
			<-s.release
		}
		info, ok := idem.InfoFromContext(c.Request().Context())
		if !ok {
			return c.String(http.StatusInternalServerError, "no idempotent execution in the request context")
		}
		c.Response().Header().Set("X-Scope", info.Scope)
		return c.JSON(http.StatusCreated, map[string]any{"order": c.Param("id"), "run": n})
	}, idemecho.Middleware(mw))
	e.POST("/flaky", func(c *echo.Context) error {
		if s.fails.Add(1) == 1 {
			return errors.New("database down") // echo answers 500: the key is released
		}
		return c.NoContent(http.StatusNoContent)
	}, idemecho.Middleware(mw))
	ts := httptest.NewServer(e)
	t.Cleanup(ts.Close)
	s.url = ts.URL
	return s
}

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
	resp, err := http.DefaultClient.Do(req)
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

func TestExecuteReplayAndMismatch(t *testing.T) {
	t.Parallel()
	s := newServer(t, false)
	first := mustPost(t, s.url+"/orders/7", `"k-1"`, `{"item":"book","qty":1}`)
	if first.status != http.StatusCreated || first.header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
	}
	if got := first.header.Get("X-Scope"); !strings.HasSuffix(got, "|POST /orders/:id") {
		t.Errorf("scope %q does not end with the route template", got)
	}
	again := mustPost(t, s.url+"/orders/7", `"k-1"`, `{"qty":1,"item":"book"}`)
	if again.status != first.status || again.body != first.body || again.header.Get(idem.HeaderReplayed) != "true" ||
		again.header.Get("X-Scope") != first.header.Get("X-Scope") {
		t.Errorf("replay: %d %v %s, want %d %s", again.status, again.header, again.body, first.status, first.body)
	}
	for _, c := range []struct{ path, body string }{{"/orders/7", `{"item":"pen"}`}, {"/orders/8", `{"item":"book","qty":1}`}} {
		r := mustPost(t, s.url+c.path, `"k-1"`, c.body)
		if r.status != http.StatusUnprocessableEntity || r.header.Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(r.body, idem.CodeKeyReused) {
			t.Errorf("reused key on %s: %d %s", c.path, r.status, r.body)
		}
	}
	if r := mustPost(t, s.url+"/orders/7", "", `{}`); r.status != http.StatusBadRequest || !strings.Contains(r.body, idem.CodeKeyMissing) {
		t.Errorf("missing key: %d %s", r.status, r.body)
	}
	if s.runs.Load() != 1 {
		t.Errorf("handler ran %d times", s.runs.Load())
	}
	// echo's own response saw each status idem sent.
	var seen []int
	for range 5 {
		seen = append(seen, <-s.logged)
	}
	if want := []int{201, 201, 422, 422, 400}; !slicesEqual(seen, want) {
		t.Errorf("statuses seen outside idem: %v, want %v", seen, want)
	}
}

func slicesEqual(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestHandlerErrorReleasesTheKey(t *testing.T) {
	t.Parallel()
	s := newServer(t, false)
	if r := mustPost(t, s.url+"/flaky", "f", `{}`); r.status != http.StatusInternalServerError {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	// The 500 was not stored: the retry runs the handler again.
	if r := mustPost(t, s.url+"/flaky", "f", `{}`); r.status != http.StatusNoContent || r.header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("retry: %d %v", r.status, r.header)
	}
	if r := mustPost(t, s.url+"/flaky", "f", `{}`); r.status != http.StatusNoContent || r.header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("replay: %d %v", r.status, r.header)
	}
	if s.fails.Load() != 2 {
		t.Errorf("handler ran %d times, want 2", s.fails.Load())
	}
}

func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	t.Parallel()
	s := newServer(t, true)
	const n = 16
	replies := make([]reply, n)
	errs := make([]error, n)
	var first sync.WaitGroup
	first.Add(1)
	go func() { defer first.Done(); replies[0], errs[0] = post(t, s.url+"/orders/1", "dup", `{"item":"book"}`) }()
	select {
	case <-s.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the first request never reached the handler")
	}
	// While the first runs, every duplicate gets 409 at once.
	var dups sync.WaitGroup
	for i := 1; i < n; i++ {
		dups.Add(1)
		go func() { defer dups.Done(); replies[i], errs[i] = post(t, s.url+"/orders/1", "dup", `{"item":"book"}`) }()
	}
	dups.Wait()
	close(s.release)
	first.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
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

// A handler that streams (Flush) reaches the client as it writes; its
// record completes without a body, so a retry gets 409
// idempotency.response_unavailable and never a second execution.
func TestStreamingHandlerIsNotReplayed(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	e := echo.New()
	e.POST("/export", func(c *echo.Context) error {
		runs.Add(1)
		c.Response().WriteHeader(http.StatusOK)
		c.Response().Write([]byte("part 1\n"))
		http.NewResponseController(c.Response()).Flush()
		_, err := c.Response().Write([]byte("part 2\n"))
		return err
	}, idemecho.Middleware(mw))
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	first := mustPost(t, srv.URL+"/export", "s", `{}`)
	if first.status != http.StatusOK || first.body != "part 1\npart 2\n" {
		t.Fatalf("first: %d %q", first.status, first.body)
	}
	again := mustPost(t, srv.URL+"/export", "s", `{}`)
	if again.status != http.StatusConflict || !strings.Contains(again.body, idem.CodeResponseUnavailable) || runs.Load() != 1 {
		t.Errorf("retry: %d %s; handler ran %d times", again.status, again.body, runs.Load())
	}
}
