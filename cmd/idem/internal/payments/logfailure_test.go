package payments

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

// failingRepo is a Repo whose database calls all fail with err.
type failingRepo struct{ err error }

func (failingRepo) Migrate(context.Context) error { return nil }
func (r failingRepo) Insert(context.Context, Payment) (Payment, error) {
	return Payment{}, r.err
}
func (r failingRepo) Get(context.Context, string, string) (Payment, error) {
	return Payment{}, r.err
}
func (r failingRepo) Count(context.Context) (int64, error) { return 0, r.err }

// lockedBuffer is a goroutine-safe log destination.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Every 5xx the demo answers has its cause in the log, with the key
// redacted: a database that refuses every insert (here: the column is
// missing) is no longer a silent 503.
func TestFailuresAreLogged(t *testing.T) {
	t.Parallel()
	var logs lockedBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	cause := errors.New(`ERROR: column "tenant" of relation "payments" does not exist (SQLSTATE 42703)`)
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, &idem.Config{TenantFunc: Tenant, FingerprintFunc: Fingerprint, MaxRequestBody: MaxBody, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	svc := &Service{Repo: failingRepo{cause}, Logger: logger}
	mux := http.NewServeMux()
	mux.Handle("POST /api/payments", mw.Handle(http.HandlerFunc(svc.Create)))
	mux.HandleFunc("GET /api/payments/count", svc.Count)
	mux.HandleFunc("GET /api/payments/{id}", svc.Get)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	const key = "raw-client-key-0001"
	res := post(t, srv.URL+"/api/payments", "application/json", key, `{"amountCents":100,"currency":"USD","reference":"r"}`)
	if res.status != http.StatusServiceUnavailable || res.code() != "payment.unavailable" {
		t.Fatalf("POST: %d %s, want 503 payment.unavailable", res.status, res.body)
	}
	if strings.Contains(res.body, "SQLSTATE") {
		t.Errorf("the answer names the database's error: %s", res.body)
	}
	for _, path := range []string{"/api/payments/count", "/api/payments/pay_x"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("GET %s: %d, want 503", path, resp.StatusCode)
		}
	}

	out := logs.String()
	if strings.Contains(out, key) {
		t.Errorf("the log holds the key in clear:\n%s", out)
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if strings.Contains(l, `"code":"payment.unavailable"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 3 {
		t.Fatalf("%d log lines for the three 503s, want 3:\n%s", len(lines), out)
	}
	for _, want := range []string{`"status":503`, `"path":"/api/payments"`, `"key":"` + idem.RedactKey(key) + `"`, `column \"tenant\" of relation \"payments\" does not exist`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("the POST's log line lacks %s:\n%s", want, lines[0])
		}
	}
	for _, l := range lines[1:] {
		if !strings.Contains(l, "SQLSTATE 42703") || !strings.Contains(l, `"level":"ERROR"`) {
			t.Errorf("a GET's log line lacks its cause: %s", l)
		}
	}
}
