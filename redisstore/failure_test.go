package redisstore_test

import (
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
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// A client pointed at a port nobody listens on: every call that needs
// Redis fails with an error that is not a fencing answer, and the
// middleware fails closed.
func TestUnreachableRedis(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	// No retries, so that each call fails at once: the point is the
	// answer, not go-redis's retry policy.
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, DialerRetries: 1, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	requireStoreDown(t, s)

	srv, ran := newServer(t, s, nil)
	resp := post(t, srv, "key-1", `{"amount":1}`)
	requireProblem(t, resp, http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
	if n := ran.Load(); n != 0 {
		t.Errorf("handler ran %d times without a store", n)
	}
}

// A proxy between the store and Redis is cut and restored: while it is cut
// every call fails and the middleware answers 503 without running the
// handler; once it is restored the same client and store work again.
func TestPartitionAndRecovery(t *testing.T) {
	t.Parallel()
	s, px := storeBehindProxy(t)
	srv, ran := newServer(t, s, nil)

	if resp := post(t, srv, "before", `{"n":1}`); resp.StatusCode != http.StatusCreated {
		t.Fatalf("before the cut: status %d", resp.StatusCode)
	}

	px.Cut()
	requireStoreDown(t, s)
	requireProblem(t, post(t, srv, "during", `{"n":2}`), http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
	// Not even a completed key can be answered without the store.
	requireProblem(t, post(t, srv, "before", `{"n":1}`), http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
	if n := ran.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want once (before the cut)", n)
	}

	px.Restore()
	if resp := post(t, srv, "during", `{"n":2}`); resp.StatusCode != http.StatusCreated {
		t.Fatalf("after the restore: status %d", resp.StatusCode)
	}
	resp := post(t, srv, "before", `{"n":1}`)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("replay after the restore: status %d, replayed %q", resp.StatusCode, resp.Header.Get(idem.HeaderReplayed))
	}
	if n := ran.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2", n)
	}
}

// requireStoreDown checks that every store call that needs Redis fails,
// and not with a sentinel: a store that cannot answer must never claim to
// know that a lease was lost.
func requireStoreDown(t *testing.T, s *redisstore.Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	scope, key, tok := idem.Scope("t", "POST /x"), "down", "token"
	_, claimErr := s.Claim(ctx, idemstore.ClaimParams{Scope: scope, Key: key, Fingerprint: fpA, Token: tok,
		Lease: time.Second, TTL: time.Minute, Now: time.Now()})
	errs := map[string]error{
		"Claim":    claimErr,
		"Renew":    s.Renew(ctx, idemstore.RenewParams{Scope: scope, Key: key, Token: tok, Lease: time.Second, Now: time.Now()}),
		"Complete": s.Complete(ctx, idemstore.CompleteParams{Scope: scope, Key: key, Token: tok, Response: &idemstore.Response{StatusCode: 200}, Now: time.Now()}),
		"Release":  s.Release(ctx, idemstore.ReleaseParams{Scope: scope, Key: key, Token: tok, Now: time.Now()}),
	}
	for name, err := range errs {
		switch {
		case err == nil:
			t.Errorf("%s succeeded without Redis", name)
		case errors.Is(err, idemstore.ErrLeaseLost), errors.Is(err, idemstore.ErrResponseTooLarge):
			t.Errorf("%s without Redis: %v, a sentinel instead of a store failure", name, err)
		case !strings.HasPrefix(err.Error(), "redisstore: "):
			t.Errorf("%s error %q lacks the package context", name, err)
		}
	}
}

// newServer serves a handler that counts its runs and answers 201 with the
// request body, behind the middleware on s.
func newServer(t *testing.T, s idemstore.Store, cfg *idem.Config) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var c idem.Config
	if cfg != nil {
		c = *cfg
	}
	c.Logger = slog.New(slog.DiscardHandler)
	mw, err := idem.NewMiddleware(s, &c)
	if err != nil {
		t.Fatalf("NewMiddleware: %v", err)
	}
	ran := new(atomic.Int32)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	})
	srv := httptest.NewServer(mw.Handle(h))
	t.Cleanup(srv.Close)
	return srv, ran
}

// post sends a JSON POST with an idempotency key and returns the response
// with its body read into a fresh reader.
func post(t *testing.T, srv *httptest.Server, key, body string) *http.Response {
	t.Helper()
	resp, err := tryPost(t.Context(), srv, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// tryPost is post for goroutines other than the test's, which must not
// call t.Fatal.
func tryPost(ctx context.Context, srv *httptest.Server, key, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/pay", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderKey, `"`+key+`"`)
	resp, err := srv.Client().Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("reading the response: %w", err)
	}
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	return resp, nil
}

// requireProblem checks a problem+json answer's status and code.
func requireProblem(t *testing.T, resp *http.Response, status int, code string) map[string]any {
	t.Helper()
	var p map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatalf("status %d, body is not JSON: %v", resp.StatusCode, err)
	}
	if resp.StatusCode != status || p["code"] != code {
		t.Fatalf("got %d %v, want %d %s", resp.StatusCode, p["code"], status, code)
	}
	return p
}

// Redis goes away while the handler runs, so the completion cannot be
// stored: the client still gets the handler's response, and the record
// stays in flight until its lease expires, when a retry runs the handler
// again. This is the gap the README tells users to close with the business
// operation's own uniqueness.
func TestPartitionDuringHandler(t *testing.T) {
	t.Parallel()
	s, px := storeBehindProxy(t)
	const lease = 300 * time.Millisecond
	mw, err := idem.NewMiddleware(s, &idem.Config{Lease: lease, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int32
	started, proceed := make(chan struct{}, 1), make(chan struct{})
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ran.Add(1) == 1 {
			started <- struct{}{}
			<-proceed
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "charged")
	})))
	t.Cleanup(srv.Close)

	type result struct {
		resp *http.Response
		err  error
	}
	first := make(chan result, 1)
	go func() {
		resp, err := tryPost(t.Context(), srv, "k", `{"n":1}`)
		first <- result{resp, err}
	}()
	select {
	case <-started:
	case r := <-first:
		t.Fatalf("the first attempt ended before its handler ran: %v, %v", r.resp, r.err)
	}
	px.Cut()
	close(proceed)
	r := <-first
	if r.err != nil {
		t.Fatal(r.err)
	}
	resp := r.resp
	if resp.StatusCode != http.StatusCreated || resp.Header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("first attempt: status %d, replayed %q; want its own 201", resp.StatusCode, resp.Header.Get(idem.HeaderReplayed))
	}
	px.Restore()

	// Retries see the key in flight until the lease runs out, then one
	// takes it over and runs the handler again. Real time has to pass.
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp := post(t, srv, "k", `{"n":1}`)
		if resp.StatusCode == http.StatusCreated {
			break
		}
		requireProblem(t, resp, http.StatusConflict, idem.CodeRequestInProgress)
		if time.Now().After(deadline) {
			t.Fatal("the key stayed in flight for 10s with a 300ms lease")
		}
		wait(lease / 3)
	}
	if n := ran.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2 (once more after the lease)", n)
	}
	// That second run completed normally: from now on retries replay.
	resp = post(t, srv, "k", `{"n":1}`)
	if resp.StatusCode != http.StatusCreated || resp.Header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("after the take-over: status %d, replayed %q", resp.StatusCode, resp.Header.Get(idem.HeaderReplayed))
	}
}

// storeBehindProxy returns a Store whose client reaches Redis through a
// TCP proxy the test can cut, on a fresh key prefix.
func storeBehindProxy(t *testing.T) (*redisstore.Store, *proxy) {
	t.Helper()
	direct := newClient(t)
	opts, err := redis.ParseURL(redisURL())
	if err != nil {
		t.Fatal(err)
	}
	px := newProxy(t, opts.Addr)
	opts.Addr = px.Addr()
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return newStore(t, c, &redisstore.Config{Prefix: newPrefix(t, direct)}), px
}
