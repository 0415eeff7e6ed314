package proxy

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// upstream is a real HTTP server standing for the protected service. It
// counts executions per Idempotency-Key and answers 201 with a small JSON
// body naming the key and the execution number; behave, if set, replaces
// that answer.
type upstream struct {
	*httptest.Server

	mu     sync.Mutex
	calls  map[string]int
	reqs   []*http.Request // copies of every request received, with bodies in bodies
	bodies []string

	// hits receives the key of every request as it arrives (buffered).
	hits chan string

	// behave, if set, answers instead of the default; n is the execution
	// number of the request's key (1 for the first).
	behave func(w http.ResponseWriter, r *http.Request, n int)
}

func newUpstream(t *testing.T, behave func(w http.ResponseWriter, r *http.Request, n int)) *upstream {
	t.Helper()
	u := &upstream{calls: map[string]int{}, hits: make(chan string, 1000), behave: behave}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

// newUpstreamOn starts the upstream on a given listener (to bring an
// unreachable upstream up on its address).
func newUpstreamOn(t *testing.T, ln net.Listener, behave func(w http.ResponseWriter, r *http.Request, n int)) *upstream {
	t.Helper()
	u := &upstream{calls: map[string]int{}, hits: make(chan string, 1000), behave: behave}
	u.Server = &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(u.serve)}}
	u.Start()
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.calls[key]++
	n := u.calls[key]
	u.reqs = append(u.reqs, r.Clone(context.Background()))
	u.bodies = append(u.bodies, string(body))
	u.mu.Unlock()
	u.hits <- key
	if u.behave != nil {
		u.behave(w, r, n)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"key": key, "n": n, "body": string(body)})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Upstream", "yes")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// count returns how often the upstream ran requests with key.
func (u *upstream) count(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls[key]
}

// total returns how many requests reached the upstream.
func (u *upstream) total() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.reqs)
}

// last returns the last request the upstream received and its body.
func (u *upstream) last(t *testing.T) (*http.Request, string) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.reqs) == 0 {
		t.Fatal("the upstream received no request")
	}
	return u.reqs[len(u.reqs)-1], u.bodies[len(u.bodies)-1]
}

// waitHit waits for the upstream to receive a request.
func (u *upstream) waitHit(t *testing.T) string {
	t.Helper()
	select {
	case k := <-u.hits:
		return k
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream received no request within 10s")
		return ""
	}
}

// newKey returns a key unique to this test run.
func newKey(t *testing.T) string {
	return strings.NewReplacer("/", "-", " ", "_").Replace(t.Name()) + "-" + rand.Text()[:12]
}

// reply is a response read in full.
type reply struct {
	status int
	header http.Header
	body   string
}

// problemCode returns the "code" member of a problem+json body.
func (r reply) problemCode() string {
	var p struct{ Code string }
	_ = json.Unmarshal([]byte(r.body), &p)
	return p.Code
}

func (r reply) String() string {
	return fmt.Sprintf("%d %v %s", r.status, r.header, r.body)
}

// testClient keeps enough connections for the duplicate storms.
var testClient = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true},
}

// testCredential is the Authorization every test request carries unless
// it names its own: a protected request without its scope header is
// refused (CodeScopeMissing).
const testCredential = "Bearer test-client"

// send makes a request and reads the whole response. headers are
// name/value pairs; Authorization defaults to testCredential (pass
// "Authorization", "" for none).
func send(t *testing.T, method, target, body string, headers ...string) reply {
	t.Helper()
	r, err := trySend(method, target, body, headers...)
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	return r
}

func trySend(method, target, body string, headers ...string) (reply, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, target, rd)
	if err != nil {
		return reply{}, err
	}
	auth := false
	for i := 0; i+1 < len(headers); i += 2 {
		if strings.EqualFold(headers[i], "Authorization") {
			auth = true
			if headers[i+1] == "" {
				continue
			}
		}
		req.Header.Add(headers[i], headers[i+1])
	}
	if !auth {
		req.Header.Set("Authorization", testCredential)
	}
	if body != "" && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := testClient.Do(req)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

// requireServer skips a test whose server is unreachable, unless CI is
// set: then it fails.
func requireServer(t testing.TB, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s unreachable (CI is set, so this fails): %v", what, err)
	}
	t.Skipf("%s unreachable: %v", what, err)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// postgresSpec returns a store spec on a fresh PostgreSQL schema, dropped
// when the test ends.
func postgresSpec(t testing.TB) string {
	t.Helper()
	dsn := envOr("IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err == nil {
		err = conn.Ping(ctx)
	}
	requireServer(t, "PostgreSQL", err)
	conn.Close(ctx)
	schema := "proxytest_" + strings.ToLower(rand.Text()[:12])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	return withQuery(t, dsn, "idem_schema", schema)
}

// redisSpec returns a store spec with a fresh key prefix, whose keys are
// deleted (by SCAN, never FLUSHDB) when the test ends.
func redisSpec(t testing.TB) string {
	t.Helper()
	raw := envOr("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
	opts, err := redis.ParseURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	requireServer(t, "Redis", client.Ping(ctx).Err())
	prefix := "idemproxytest:" + rand.Text()[:12] + ":"
	t.Cleanup(func() {
		defer client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			if err := client.Del(ctx, iter.Val()).Err(); err != nil {
				t.Errorf("redis cleanup: %v", err)
				return
			}
		}
		if err := iter.Err(); err != nil {
			t.Errorf("redis cleanup: %v", err)
		}
	})
	return withQuery(t, raw, "prefix", prefix)
}

func withQuery(t testing.TB, raw, name, value string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// closedAddr returns a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// postWhileInProgress POSTs body with the Idempotency-Key key to target again
// every interval while the answer is 409 (the key in progress), for at most
// timeout, and returns the last reply: polling a condition with a deadline.
func postWhileInProgress(t *testing.T, target, body, key string, timeout, interval time.Duration) reply {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := send(t, http.MethodPost, target, body, idem.HeaderKey, key)
		if r.status != http.StatusConflict || time.Now().After(deadline) {
			return r
		}
		time.Sleep(interval)
	}
}

// listenOn listens on addr again (after closedAddr), retrying briefly in
// case the port is still being released.
func listenOn(t *testing.T, addr string) net.Listener {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			return ln
		}
		if time.Now().After(deadline) {
			t.Fatalf("listen on %s again: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond) // polling a condition with a deadline: the port must come free
	}
}
