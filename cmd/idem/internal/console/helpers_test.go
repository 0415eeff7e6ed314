package console

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/idemstore"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// unreachable skips the test when a server is missing and CI is unset,
// and fails it when CI is set.
func unreachable(t *testing.T, what string, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s unreachable (CI is set): %v", what, err)
	}
	t.Skipf("%s unreachable: %v", what, err)
}

func randomName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// backends are the stores the console runs on, each fresh for its test.
var backends = []struct {
	name string
	open func(t *testing.T) *backend.Store
}{
	{"SQLite", func(t *testing.T) *backend.Store { return openStore(t, filepath.Join(t.TempDir(), "records.db")) }},
	{"PostgreSQL", func(t *testing.T) *backend.Store {
		base := envOr("IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
		schema := "console_" + randomName()
		u, err := url.Parse(base)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		q.Set("idem_schema", schema)
		u.RawQuery = q.Encode()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			unreachable(t, "PostgreSQL", err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
			_ = conn.Close(ctx)
		})
		return openStore(t, u.String())
	}},
	{"Redis", func(t *testing.T) *backend.Store {
		base := envOr("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
		opts, err := redis.ParseURL(base)
		if err != nil {
			t.Fatal(err)
		}
		c := redis.NewClient(opts)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if err := c.Ping(ctx).Err(); err != nil {
			c.Close()
			unreachable(t, "Redis", err)
		}
		prefix := "console-" + randomName() + ":"
		t.Cleanup(func() {
			ctx := context.Background()
			keys, _ := c.Keys(ctx, prefix+"*").Result()
			if len(keys) > 0 {
				c.Del(ctx, keys...)
			}
			c.Close()
		})
		sep := "?"
		if strings.Contains(base, "?") {
			sep = "&"
		}
		return openStore(t, base+sep+"prefix="+prefix)
	}},
	{"memory", func(t *testing.T) *backend.Store { return openStore(t, "memory") }},
}

func openStore(t *testing.T, spec string) *backend.Store {
	t.Helper()
	s, err := backend.Open(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// logBuffer collects the console's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// bundle is a console over a store, served by httptest, with a browser-like
// client (cookies, Origin on POSTs).
type bundle struct {
	t       *testing.T
	store   *backend.Store
	console *Console
	srv     *httptest.Server
	client  *http.Client
	log     *logBuffer
}

func setup(t *testing.T, s *backend.Store, mod func(*Config)) *bundle {
	t.Helper()
	logs := &logBuffer{}
	cfg := Config{Store: s, Logger: slog.New(slog.NewTextHandler(logs, nil)), TTL: time.Hour}
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(func() { srv.Close(); c.Close() })
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &bundle{t: t, store: s, console: c, srv: srv, client: client, log: logs}
}

// get fetches a console path and returns the status and body.
func (b *bundle) get(path string, hdr ...string) (int, string, http.Header) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.srv.URL+path, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return b.do(req)
}

func (b *bundle) do(req *http.Request) (int, string, http.Header) {
	b.t.Helper()
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header
}

// post sends a form as the console's own pages do (Origin set, the CSRF
// token of the session taken from the last page fetched).
func (b *bundle) post(path string, form url.Values, hdr ...string) (int, string, http.Header) {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", b.srv.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	return b.do(req)
}

var (
	csrfRE    = regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	confirmRE = regexp.MustCompile(`name="confirm" value="([^"]+)"`)
	fenceRE   = regexp.MustCompile(`name="fence" value="([^"]+)"`)
	idRE      = regexp.MustCompile(`href="/records/([0-9a-f]{64})"`)
)

func field(t testing.TB, re *regexp.Regexp, body string) string {
	t.Helper()
	m := re.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in the page:\n%s", re, body)
	}
	return m[1]
}

// csrf returns the session's CSRF token, from the overview.
func (b *bundle) csrf() string {
	b.t.Helper()
	code, body, _ := b.get("/")
	if code != http.StatusOK {
		b.t.Fatalf("GET / = %d:\n%s", code, body)
	}
	return field(b.t, csrfRE, body)
}

// records puts records of every kind in the store: completed ones, one in
// flight with a live lease, one whose lease ended (owner gone) and, on a
// StepStore, one suspended after a step.
type seeded struct {
	completed         []string // keys
	live, gone, susp  string
	scope, otherScope string
}

func seed(t *testing.T, s *backend.Store, completed int) seeded {
	t.Helper()
	ctx := context.Background()
	sd := seeded{scope: idem.Scope("t1", "POST /pay"), otherScope: idem.Scope("t2", "POST /pay"),
		live: "live-key", gone: "gone-key", susp: "susp-key"}
	exec, err := idem.NewExecutor(s.Records, &idem.Config{TTL: time.Hour, Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range completed {
		key := "done-" + string(rune('a'+i%26)) + "-" + strings.Repeat("x", i/26)
		scope := sd.scope
		if i%3 == 2 {
			scope = sd.otherScope
		}
		if _, err := exec.Do(ctx, idem.DoParams{Scope: scope, Key: key, Fingerprint: "v1:fp"}, func(context.Context) (*idem.Response, error) {
			return &idem.Response{StatusCode: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Secret-Ish": {"hdr-value"}},
				Body: []byte(`{"body":"<script>alert(1)</script>"}`)}, nil
		}); err != nil {
			t.Fatal(err)
		}
		sd.completed = append(sd.completed, key)
	}
	claim := func(key string, lease time.Duration) {
		r, err := s.Records.Claim(ctx, idemstore.ClaimParams{Scope: sd.scope, Key: key, Fingerprint: "v1:fp", Token: "tok-" + key,
			Lease: lease, TTL: time.Hour, Now: time.Now()})
		if err != nil || r.Outcome != idemstore.ClaimAcquired {
			t.Fatalf("claim %s: %v %v", key, r.Outcome, err)
		}
	}
	claim(sd.live, time.Hour)
	claim(sd.gone, time.Millisecond)
	if _, ok := s.Records.(idemstore.StepStore); ok {
		_, err := exec.Do(ctx, idem.DoParams{Scope: sd.scope, Key: sd.susp, Fingerprint: "v1:fp"}, func(ctx context.Context) (*idem.Response, error) {
			if _, err := idem.Step(ctx, "first", func(context.Context) ([]byte, error) { return []byte("step-data"), nil }); err != nil {
				return nil, err
			}
			return nil, errors.New("the provider is down")
		})
		if err == nil {
			t.Fatal("the suspended operation succeeded")
		}
	} else {
		sd.susp = ""
	}
	// Wait until the console's clock is past the ended lease (the store's
	// clock set it a millisecond ahead).
	in := s.Records.(idemstore.Inspector)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := in.Get(ctx, idemstore.GetParams{Scope: sd.scope, Key: sd.gone, Now: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		if r.LeaseExpiresAt.Before(time.Now()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the 1 ms lease did not end within 5 s")
		}
	}
	return sd
}
