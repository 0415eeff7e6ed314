package idemclient_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemclient"
	"github.com/idemhq/idem/memstore"
)

// seen is what the server saw of one request, before the idem middleware.
type seen struct {
	key  []string // the Idempotency-Key field values, as received
	body string
	at   time.Time
}

// testServer is a real HTTP server: a log of the requests it receives, a
// script of canned answers for the first requests, and then the idem
// middleware on memstore in front of a payments handler.
type testServer struct {
	*httptest.Server
	payments atomic.Int64
	conns    atomic.Int64

	mu       sync.Mutex
	requests []seen
	script   []http.HandlerFunc
}

// newTestServer starts a server; script answers the first len(script)
// requests instead of the middleware. cfg configures the middleware.
func newTestServer(t *testing.T, cfg *idem.Config, script ...http.HandlerFunc) *testServer {
	t.Helper()
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &testServer{script: script}
	payments := mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := s.payments.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`, n)
	}))
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		s.mu.Lock()
		s.requests = append(s.requests, seen{key: r.Header.Values(idem.HeaderKey), body: string(body), at: time.Now()})
		var h http.HandlerFunc
		if len(s.script) > 0 {
			h, s.script = s.script[0], s.script[1:]
		}
		s.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		payments.ServeHTTP(w, r)
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

func (s *testServer) seen() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.requests...)
}

// status answers with code, and Retry-After when retryAfter is not empty.
func status(code int, retryAfter string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, "status %d\n", code)
	}
}

// newClient returns a client on its own base transport (so that tests do
// not share connections) with fast back-off unless cfg says otherwise.
func newClient(t *testing.T, cfg *idemclient.Config) *http.Client {
	t.Helper()
	c := idemclient.Config{BackoffBase: time.Millisecond, BackoffCap: 2 * time.Millisecond}
	if cfg != nil {
		c = *cfg
	}
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	tr, err := idemclient.New(base, &c)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: tr}
}

// post sends a JSON POST to /payments and returns the response with its
// body read.
func post(t *testing.T, c *http.Client, url string, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/payments", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func mustResult(t *testing.T, resp *http.Response) idemclient.Result {
	t.Helper()
	res, ok := idemclient.ResultOf(resp)
	if !ok {
		t.Fatal("ResultOf: no result on a managed response")
	}
	return res
}

var quotedUUID = regexp.MustCompile(`^"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"$`)

func TestGeneratedKeyIsReusedOnEveryRetry(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, nil, status(503, ""), status(502, ""))
	c := newClient(t, nil)

	req, err := http.NewRequest(http.MethodPost, s.URL+"/payments", strings.NewReader(`{"amount":1}`))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d, want 201", resp.StatusCode)
	}
	if _, ok := req.Header[idem.HeaderKey]; ok {
		t.Errorf("the caller's request was given a key: %v", req.Header)
	}
	got := s.seen()
	if len(got) != 3 {
		t.Fatalf("server saw %d requests, want 3", len(got))
	}
	for i, r := range got {
		if len(r.key) != 1 || r.key[0] != got[0].key[0] {
			t.Errorf("request %d key %q, want the first request's %q", i, r.key, got[0].key)
		}
		if r.body != `{"amount":1}` {
			t.Errorf("request %d body %q", i, r.body)
		}
	}
	if !quotedUUID.MatchString(got[0].key[0]) {
		t.Errorf("generated key %q is not a quoted version 4 UUID", got[0].key[0])
	}
	res := mustResult(t, resp)
	if want := strings.Trim(got[0].key[0], `"`); res.Key != want || res.Attempts != 3 || res.Replayed {
		t.Errorf("Result %+v, want key %s, 3 attempts, not replayed", res, want)
	}
	if n := s.payments.Load(); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}

	// Another request is another operation: a new key.
	resp2, _ := post(t, c, s.URL, `{"amount":1}`)
	if k := mustResult(t, resp2).Key; k == res.Key {
		t.Errorf("two requests shared the key %s", k)
	}
}

func TestCallerKeyIsSentUnchanged(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ sent, key string }{
		{`order-7`, `order-7`},
		{`"order-8"`, `order-8`},
		{`"a\"b"`, `a"b`},
	} {
		t.Run(tc.sent, func(t *testing.T) {
			t.Parallel()
			s := newTestServer(t, nil, status(503, ""))
			resp, _ := post(t, newClient(t, nil), s.URL, `{}`, idem.HeaderKey, tc.sent)
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("status %d", resp.StatusCode)
			}
			for i, r := range s.seen() {
				if len(r.key) != 1 || r.key[0] != tc.sent {
					t.Errorf("request %d carried %q, want %q", i, r.key, tc.sent)
				}
			}
			if res := mustResult(t, resp); res.Key != tc.key || res.Attempts != 2 {
				t.Errorf("Result %+v, want key %q after 2 attempts", res, tc.key)
			}
		})
	}
}

func TestKeyFunc(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, nil)
	cfg := &idemclient.Config{KeyFunc: func(r *http.Request) (string, error) { return `order "42"`, nil }}
	resp, _ := post(t, newClient(t, cfg), s.URL, `{}`)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if got := s.seen()[0].key; len(got) != 1 || got[0] != `"order \"42\""` {
		t.Errorf("sent %q, want the Structured Field string", got)
	}
	if k := mustResult(t, resp).Key; k != `order "42"` {
		t.Errorf("Result.Key %q", k)
	}

	for _, bad := range []string{"", strings.Repeat("k", idemclient.MaxKeyLength+1), "caf\u00e9"} {
		body := &trackedBody{Reader: strings.NewReader("{}")}
		req, _ := http.NewRequest(http.MethodPost, s.URL, body)
		tr, err := idemclient.New(nil, &idemclient.Config{KeyFunc: func(*http.Request) (string, error) { return bad, nil }})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tr.RoundTrip(req); err == nil {
			t.Errorf("KeyFunc key %q: no error", bad)
		}
		if !body.closed.Load() {
			t.Errorf("KeyFunc key %q: request body not closed", bad)
		}
	}
	if n := len(s.seen()); n != 1 {
		t.Errorf("invalid keys reached the server: %d requests", n)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, nil, status(429, "1"))
	var delays []time.Duration
	cfg := &idemclient.Config{AttemptFunc: func(_ *http.Request, a idemclient.Attempt) {
		if a.Retry {
			delays = append(delays, a.Delay)
		}
	}}
	resp, _ := post(t, newClient(t, cfg), s.URL, `{}`)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if len(delays) != 1 || delays[0] != time.Second {
		t.Errorf("delays %v, want [1s] from Retry-After", delays)
	}
	got := s.seen()
	if gap := got[1].at.Sub(got[0].at); gap < time.Second {
		t.Errorf("retried after %v, before Retry-After", gap)
	}
}

func TestRetryAfterHTTPDate(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, nil, func(w http.ResponseWriter, r *http.Request) {
		// HTTP-dates have whole seconds: the wait is between 1 and 2 s.
		status(503, time.Now().Add(2*time.Second).UTC().Format(http.TimeFormat))(w, r)
	})
	var delay time.Duration
	cfg := &idemclient.Config{AttemptFunc: func(_ *http.Request, a idemclient.Attempt) {
		if a.Retry {
			delay = a.Delay
		}
	}}
	resp, _ := post(t, newClient(t, cfg), s.URL, `{}`)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if delay < 500*time.Millisecond || delay > 2*time.Second {
		t.Errorf("waited %v for a Retry-After date 1 to 2 s ahead", delay)
	}
	got := s.seen()
	if gap := got[1].at.Sub(got[0].at); gap < delay {
		t.Errorf("retried after %v, before the %v Retry-After asked for", gap, delay)
	}
}

func TestRetriedStatuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code       int
		retryAfter string
	}{
		{409, "0"}, {429, ""}, {502, ""}, {503, ""}, {503, "0"}, {504, ""},
	} {
		t.Run(fmt.Sprint(tc.code, " ", tc.retryAfter), func(t *testing.T) {
			t.Parallel()
			s := newTestServer(t, nil, status(tc.code, tc.retryAfter))
			resp, _ := post(t, newClient(t, nil), s.URL, `{}`)
			if resp.StatusCode != http.StatusCreated || len(s.seen()) != 2 {
				t.Errorf("status %d after %d requests, want 201 after 2", resp.StatusCode, len(s.seen()))
			}
		})
	}
}

func TestNotRetriedStatuses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code       int
		retryAfter string
	}{
		{400, ""}, {401, ""}, {404, ""}, {409, ""}, {409, "soon"}, {413, "1"}, {422, ""}, {500, ""}, {501, ""},
	} {
		t.Run(fmt.Sprint(tc.code, " ", tc.retryAfter), func(t *testing.T) {
			t.Parallel()
			s := newTestServer(t, nil, status(tc.code, tc.retryAfter))
			resp, body := post(t, newClient(t, nil), s.URL, `{}`)
			if resp.StatusCode != tc.code || len(s.seen()) != 1 {
				t.Errorf("status %d after %d requests, want %d after 1", resp.StatusCode, len(s.seen()), tc.code)
			}
			if want := fmt.Sprintf("status %d\n", tc.code); body != want {
				t.Errorf("body %q, want %q", body, want)
			}
			if res := mustResult(t, resp); res.Attempts != 1 {
				t.Errorf("Result.Attempts %d", res.Attempts)
			}
		})
	}
}

// A key reused with another payload gets idem's 422, which no retry can
// change.
func TestMismatchIsNotRetried(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, nil)
	c := newClient(t, nil)
	post(t, c, s.URL, `{"amount":1}`, idem.HeaderKey, `"k-1"`)
	resp, _ := post(t, c, s.URL, `{"amount":2}`, idem.HeaderKey, `"k-1"`)
	if resp.StatusCode != http.StatusUnprocessableEntity || len(s.seen()) != 2 {
		t.Errorf("status %d after %d requests, want 422 after 2", resp.StatusCode, len(s.seen()))
	}
}

// While the first request runs, a duplicate gets idem's 409 with
// Retry-After; the client waits and then receives the first request's
// response as a replay.
func TestInProgressConflictThenReplay(t *testing.T) {
	t.Parallel()
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, &idem.Config{RetryAfter: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var payments atomic.Int64
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if payments.Add(1) == 1 {
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "paid once")
	})))
	t.Cleanup(srv.Close)

	first := make(chan *http.Response, 1)
	firstClient := newClient(t, nil)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"n":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idem.HeaderKey, `"dup-1"`)
		resp, err := firstClient.Do(req)
		if err != nil {
			t.Error(err)
			first <- nil
			return
		}
		resp.Body.Close()
		first <- resp
	}()
	<-entered

	var statuses []int
	cfg := &idemclient.Config{AttemptFunc: func(_ *http.Request, a idemclient.Attempt) {
		statuses = append(statuses, a.StatusCode)
		if a.Number == 1 {
			close(release) // the duplicate has met the in-flight record
		}
	}}
	resp, body := post(t, newClient(t, cfg), srv.URL, `{"n":1}`, idem.HeaderKey, `"dup-1"`)
	if resp.StatusCode != http.StatusCreated || body != "paid once" {
		t.Fatalf("duplicate got %d %q", resp.StatusCode, body)
	}
	if statuses[0] != http.StatusConflict {
		t.Errorf("first attempt of the duplicate got %d, want 409", statuses[0])
	}
	if res := mustResult(t, resp); !res.Replayed || res.Attempts < 2 {
		t.Errorf("Result %+v, want a replay after a retry", res)
	}
	if r := <-first; r != nil && r.StatusCode != http.StatusCreated {
		t.Errorf("first request got %d", r.StatusCode)
	}
	if n := payments.Load(); n != 1 {
		t.Errorf("%d payments, want 1", n)
	}
}

func TestMaxAttempts(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, nil, status(503, ""), status(503, ""), status(503, ""), status(503, ""))
	resp, body := post(t, newClient(t, &idemclient.Config{MaxAttempts: 3, BackoffBase: time.Millisecond, BackoffCap: time.Millisecond}), s.URL, `{}`)
	if resp.StatusCode != 503 || len(s.seen()) != 3 {
		t.Errorf("status %d after %d requests, want 503 after 3", resp.StatusCode, len(s.seen()))
	}
	if body != "status 503\n" {
		t.Errorf("the last response's body was not returned intact: %q", body)
	}
	if res := mustResult(t, resp); res.Attempts != 3 {
		t.Errorf("Result.Attempts %d", res.Attempts)
	}
	// Discarded responses were drained, so their connection was reused.
	if n := s.conns.Load(); n != 1 {
		t.Errorf("%d connections for 3 attempts, want 1", n)
	}
}

// A Retry-After that would end past the request's deadline, or past
// MaxElapsed, is not waited for: the response is returned at once.
func TestNoWaitPastDeadline(t *testing.T) {
	t.Parallel()
	t.Run("context", func(t *testing.T) {
		t.Parallel()
		s := newTestServer(t, nil, status(503, "2"))
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader("{}"))
		start := time.Now()
		resp, err := newClient(t, nil).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 || len(s.seen()) != 1 || ctx.Err() != nil {
			t.Errorf("status %d after %d requests (context %v), want 503 at once", resp.StatusCode, len(s.seen()), ctx.Err())
		}
		if el := time.Since(start); el >= time.Second {
			t.Errorf("returned after %v: waited into the deadline", el)
		}
	})
	t.Run("MaxElapsed", func(t *testing.T) {
		t.Parallel()
		s := newTestServer(t, nil, status(503, "1"))
		resp, _ := post(t, newClient(t, &idemclient.Config{MaxElapsed: time.Second}), s.URL, `{}`)
		if resp.StatusCode != 503 || len(s.seen()) != 1 {
			t.Errorf("status %d after %d requests, want 503 after 1", resp.StatusCode, len(s.seen()))
		}
	})
	t.Run("huge Retry-After", func(t *testing.T) {
		t.Parallel()
		s := newTestServer(t, nil, status(503, "99999999999999999999999"))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a bound for the failure case
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader("{}"))
		resp, err := newClient(t, nil).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 || len(s.seen()) != 1 {
			t.Errorf("status %d after %d requests, want 503 after 1", resp.StatusCode, len(s.seen()))
		}
	})
}

func TestCallerCancelStopsTheWait(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, nil, status(503, "5"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := newClient(t, &idemclient.Config{AttemptFunc: func(_ *http.Request, a idemclient.Attempt) {
		if a.Retry {
			cancel()
		}
	}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader("{}"))
	start := time.Now()
	_, err := c.Do(req)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	var ie *idemclient.Error
	if !errors.As(err, &ie) || ie.Result.Attempts != 1 || ie.Result.Key == "" {
		t.Errorf("error %v does not carry the Result", err)
	}
	if el := time.Since(start); el >= 5*time.Second {
		t.Errorf("returned after %v", el)
	}
}

// A caller that cancels while an attempt is in flight gets its
// cancellation back, without a retry.
func TestCallerCancelDuringAttempt(t *testing.T) {
	t.Parallel()
	entered := make(chan struct{})
	s := newTestServer(t, nil, func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-r.Context().Done() // until the client goes away
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-entered; cancel() }()
	var attempts []idemclient.Attempt
	c := newClient(t, &idemclient.Config{AttemptFunc: func(_ *http.Request, a idemclient.Attempt) {
		attempts = append(attempts, a)
	}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, strings.NewReader("{}"))
	_, err := c.Do(req)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("error %v, want context.Canceled", err)
	}
	if len(attempts) != 1 || attempts[0].Retry || len(s.seen()) != 1 {
		t.Errorf("attempts %+v, server saw %d: want one attempt and no retry", attempts, len(s.seen()))
	}
}

func TestTransportErrorsAreRetried(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused

	attempts := 0
	c := newClient(t, &idemclient.Config{MaxAttempts: 3, BackoffBase: time.Millisecond, BackoffCap: time.Millisecond,
		AttemptFunc: func(*http.Request, idemclient.Attempt) { attempts++ }})
	_, err = c.Post("http://"+addr+"/payments", "application/json", strings.NewReader("{}"))
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("error %v, want connection refused", err)
	}
	var ie *idemclient.Error
	if !errors.As(err, &ie) || ie.Result.Attempts != 3 || attempts != 3 {
		t.Errorf("error %v after %d attempts, want an *Error after 3", err, attempts)
	}
}

// A certificate the client does not trust will not be trusted on a retry.
func TestCertificateErrorsAreNotRetried(t *testing.T) {
	t.Parallel()
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the failed handshake is expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	attempts := 0
	c := newClient(t, &idemclient.Config{AttemptFunc: func(*http.Request, idemclient.Attempt) { attempts++ }})
	_, err := c.Post(srv.URL, "application/json", strings.NewReader("{}"))
	var ie *idemclient.Error
	if err == nil || !errors.As(err, &ie) || attempts != 1 {
		t.Errorf("error %v after %d attempts, want a certificate error after 1", err, attempts)
	}
}

// trackedBody is a request body without GetBody (http.NewRequest does not
// know its type) that records whether it was closed.
type trackedBody struct {
	io.Reader
	closed atomic.Bool
}

func (b *trackedBody) Close() error { b.closed.Store(true); return nil }

func TestBodies(t *testing.T) {
	t.Parallel()
	payload := strings.Repeat("p", 100)
	t.Run("GetBody", func(t *testing.T) {
		t.Parallel()
		s := newTestServer(t, nil, status(503, ""), status(503, ""))
		req, _ := http.NewRequest(http.MethodPost, s.URL, bytes.NewReader([]byte(payload)))
		resp, err := newClient(t, nil).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		checkBodies(t, s, resp, 3, payload)
	})
	t.Run("buffered", func(t *testing.T) {
		t.Parallel()
		s := newTestServer(t, nil, status(503, ""), status(503, ""))
		body := &trackedBody{Reader: strings.NewReader(payload)}
		req, _ := http.NewRequest(http.MethodPost, s.URL, body)
		resp, err := newClient(t, &idemclient.Config{MaxBufferedBody: 100}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		checkBodies(t, s, resp, 3, payload)
		if !body.closed.Load() {
			t.Error("the caller's body was not closed")
		}
	})
	t.Run("too large: response", func(t *testing.T) {
		t.Parallel()
		s := newTestServer(t, nil, status(503, ""))
		req, _ := http.NewRequest(http.MethodPost, s.URL, &trackedBody{Reader: strings.NewReader(payload)})
		resp, err := newClient(t, &idemclient.Config{MaxBufferedBody: 99}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Errorf("status %d, want the 503 returned unretried", resp.StatusCode)
		}
		checkBodies(t, s, resp, 1, payload)
	})
	t.Run("too large by Content-Length: error", func(t *testing.T) {
		t.Parallel()
		s := newTestServer(t, nil, func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close() // the connection drops without an answer
			}
		})
		body := &trackedBody{Reader: strings.NewReader(payload)}
		req, _ := http.NewRequest(http.MethodPost, s.URL, body)
		req.ContentLength = int64(len(payload))
		_, err := newClient(t, &idemclient.Config{MaxBufferedBody: 10}).Do(req)
		var ie *idemclient.Error
		if !errors.Is(err, idemclient.ErrBodyNotReplayable) || !errors.As(err, &ie) || ie.Result.Attempts != 1 {
			t.Errorf("error %v, want ErrBodyNotReplayable after 1 attempt", err)
		}
		if n := len(s.seen()); n != 1 || s.seen()[0].body != payload {
			t.Errorf("server saw %d requests", n)
		}
		if !body.closed.Load() {
			t.Error("the caller's body was not closed")
		}
	})
}

func checkBodies(t *testing.T, s *testServer, resp *http.Response, attempts int, payload string) {
	t.Helper()
	got := s.seen()
	if len(got) != attempts {
		t.Fatalf("server saw %d requests, want %d", len(got), attempts)
	}
	for i, r := range got {
		if r.body != payload {
			t.Errorf("request %d body has %d bytes, want %d", i, len(r.body), len(payload))
		}
	}
	if res := mustResult(t, resp); res.Attempts != attempts {
		t.Errorf("Result.Attempts %d, want %d", res.Attempts, attempts)
	}
}

// Methods outside Config.Methods pass through: no key, no retry.
func TestOtherMethodsPassThrough(t *testing.T) {
	t.Parallel()
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			s := newTestServer(t, nil, status(503, "0"))
			req, _ := http.NewRequest(method, s.URL, nil)
			resp, err := newClient(t, nil).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got := s.seen()
			if resp.StatusCode != 503 || len(got) != 1 || len(got[0].key) != 0 {
				t.Errorf("status %d after %d requests, key %q: want 503, 1, none", resp.StatusCode, len(got), got[0].key)
			}
			if _, ok := idemclient.ResultOf(resp); ok {
				t.Error("ResultOf reports a result for a request that passed through")
			}
		})
	}
	t.Run("PUT in Methods", func(t *testing.T) {
		t.Parallel()
		s := newTestServer(t, &idem.Config{RequiredMethods: []string{http.MethodPut}}, status(503, "0"))
		req, _ := http.NewRequest(http.MethodPut, s.URL, strings.NewReader("{}"))
		resp, err := newClient(t, &idemclient.Config{Methods: []string{http.MethodPut}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || len(s.seen()) != 2 {
			t.Errorf("status %d after %d requests", resp.StatusCode, len(s.seen()))
		}
	})
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]idemclient.Config{
		"MaxAttempts":     {MaxAttempts: -1},
		"MaxElapsed":      {MaxElapsed: -1},
		"BackoffBase":     {BackoffBase: -1},
		"BackoffCap":      {BackoffBase: time.Second, BackoffCap: time.Millisecond},
		"MaxBufferedBody": {MaxBufferedBody: -1},
	} {
		if _, err := idemclient.New(nil, &cfg); err == nil {
			t.Errorf("%s: invalid value accepted", name)
		}
	}
	if _, err := idemclient.New(nil, nil); err != nil {
		t.Errorf("nil config: %v", err)
	}
}

// dropProxy is a TCP proxy in front of a server. On its first connection it
// forwards the request, waits for the first byte of the server's response,
// and then closes both sides: the server has done the work (idem stores the
// response before sending it), and the client never hears of it.
type dropProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
	first atomic.Bool
}

func startDropProxy(t *testing.T, backend string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{ln: ln}
	p.first.Store(true)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.serve(c, backend, p.first.Swap(false)) }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return ln.Addr().String()
}

func (p *dropProxy) serve(client net.Conn, backend string, drop bool) {
	server, err := net.Dial("tcp", backend)
	if err != nil {
		client.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, client, server)
	p.mu.Unlock()
	defer client.Close()
	defer server.Close()
	p.wg.Add(1)
	go func() { defer p.wg.Done(); io.Copy(server, client) }()
	if drop {
		var b [1]byte
		server.Read(b[:])
		return
	}
	io.Copy(client, server)
}

// The hardest case: the server executes the payment and the connection
// drops before the response arrives. The client retries with the same key
// and receives the stored response as a replay; one payment exists.
func TestLostResponseIsReplayed(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, nil)
	proxy := startDropProxy(t, s.Listener.Addr().String())
	var errs []error
	c := newClient(t, &idemclient.Config{AttemptFunc: func(_ *http.Request, a idemclient.Attempt) {
		errs = append(errs, a.Err)
	}})

	resp, body := post(t, c, "http://"+proxy, `{"amount":2599}`)
	if resp.StatusCode != http.StatusCreated || body != `{"id":"pay_1"}` {
		t.Fatalf("got %d %q", resp.StatusCode, body)
	}
	if len(errs) != 2 || errs[0] == nil || errs[1] != nil {
		t.Errorf("attempt errors %v, want a transport error, then success", errs)
	}
	res := mustResult(t, resp)
	if !res.Replayed || res.Attempts != 2 || resp.Header.Get(idem.HeaderReplayed) != "true" {
		t.Errorf("Result %+v, header %q: want a replay on attempt 2", res, resp.Header.Get(idem.HeaderReplayed))
	}
	got := s.seen()
	if len(got) != 2 || got[0].key[0] != got[1].key[0] || got[0].key[0] != strconv.Quote(res.Key) {
		t.Errorf("keys seen %v, want the same key twice", got)
	}
	if n := s.payments.Load(); n != 1 {
		t.Errorf("%d payments, want exactly 1", n)
	}
}
