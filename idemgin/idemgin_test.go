package idemgin_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemgin"
	"github.com/idemhq/idem/memstore"
)

func init() { gin.SetMode(gin.TestMode) }

// server is a gin engine behind a real HTTP server, with an order route
// that counts its executions.
type server struct {
	url     string
	runs    atomic.Int64
	release chan struct{} // when set, the handler waits for it
	entered chan struct{}
	after   atomic.Int64 // runs of a handler after the idem one
	store   *memstore.Store
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
	s := &server{store: store}
	if block {
		s.release, s.entered = make(chan struct{}), make(chan struct{}, 16)
	}
	r := gin.New()
	r.POST("/orders/:id", idemgin.Middleware(mw), func(c *gin.Context) {
		n := s.runs.Add(1)
		if s.release != nil {
			s.entered <- struct{}{}
			<-s.release
		}
		info, ok := idem.InfoFromContext(c.Request.Context())
		if !ok {
			c.String(http.StatusInternalServerError, "no idempotent execution in the request context")
			return
		}
		c.Header("X-Run", "run")
		c.Header("X-Operation-Key", info.Scope)
		c.JSON(http.StatusCreated, gin.H{"order": c.Param("id"), "run": n})
	}, func(c *gin.Context) { s.after.Add(1) })
	r.POST("/status-only", idemgin.Middleware(mw), func(c *gin.Context) {
		s.runs.Add(1)
		c.Status(http.StatusAccepted)
	})
	r.GET("/orders/:id", idemgin.Middleware(mw), func(c *gin.Context) { c.String(http.StatusOK, "read") })
	ts := httptest.NewServer(r)
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
	if first.status != http.StatusCreated || first.header.Get(idem.HeaderReplayed) != "false" || first.header.Get("X-Run") != "run" {
		t.Fatalf("first: %d %v %s", first.status, first.header, first.body)
	}
	if s.after.Load() != 1 {
		t.Errorf("the handler after the route's ran %d times", s.after.Load())
	}
	// Scope names gin's route template, not the path.
	if got := first.header.Get("X-Operation-Key"); !strings.HasSuffix(got, "|POST /orders/:id") {
		t.Errorf("scope %q does not end with the route template", got)
	}
	// The same request, members reordered: a replay, byte for byte.
	again := mustPost(t, s.url+"/orders/7", `"k-1"`, `{"qty":1,"item":"book"}`)
	if again.status != first.status || again.body != first.body || again.header.Get(idem.HeaderReplayed) != "true" ||
		again.header.Get("X-Run") != "run" {
		t.Errorf("replay: %d %v %s, want %d %s", again.status, again.header, again.body, first.status, first.body)
	}
	if s.runs.Load() != 1 || s.after.Load() != 1 {
		t.Errorf("handlers ran %d and %d times, want once each", s.runs.Load(), s.after.Load())
	}
	// Another payload with the key: 422; another order of the route: 422.
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
	// GET needs no key and passes through.
	resp, err := http.Get(s.url + "/orders/7")
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
	for i := range 2 {
		r := mustPost(t, s.url+"/status-only", "k", `{}`)
		if r.status != http.StatusAccepted || r.header.Get(idem.HeaderReplayed) != []string{"false", "true"}[i] {
			t.Errorf("attempt %d: %d %v", i, r.status, r.header)
		}
	}
	if s.runs.Load() != 1 {
		t.Errorf("handler ran %d times", s.runs.Load())
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
	r := gin.New()
	r.POST("/export", idemgin.Middleware(mw), func(c *gin.Context) {
		runs.Add(1)
		c.Status(http.StatusOK)
		c.Writer.WriteString("part 1\n")
		c.Writer.Flush()
		c.Writer.WriteString("part 2\n")
	})
	srv := httptest.NewServer(r)
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
