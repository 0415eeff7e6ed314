package provider_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/provider"
	"github.com/idemhq/idem/sqlitestore"
)

// logBuffer collects log lines from the provider's handlers.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

func newProvider(t *testing.T, cfg provider.Config) *httptest.Server {
	t.Helper()
	store, err := sqlitestore.Open(t.Context(), filepath.Join(t.TempDir(), "p.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	p, err := provider.New(t.Context(), store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func charge(t *testing.T, url, key, body string) (*http.Response, string, error) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/charges", strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b), nil
}

func count(t *testing.T, url string) int64 {
	t.Helper()
	resp, err := http.Get(url + "/v1/charges/count")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var c struct{ Count int64 }
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		t.Fatal(err)
	}
	return c.Count
}

const body = `{"amountCents":2599,"currency":"USD","reference":"inv-1"}`

func TestChargeReplayAndList(t *testing.T) {
	t.Parallel()
	srv := newProvider(t, provider.Config{})
	r1, b1, err := charge(t, srv.URL, "k1", body)
	if err != nil || r1.StatusCode != http.StatusCreated {
		t.Fatalf("charge: %v %v %s", err, r1, b1)
	}
	var c provider.Charge
	if err := json.Unmarshal([]byte(b1), &c); err != nil || !strings.HasPrefix(c.ID, "ch_") || c.AmountCents != 2599 || c.Currency != "USD" || c.Reference != "inv-1" {
		t.Fatalf("charge body %s: %v", b1, err)
	}
	r2, b2, err := charge(t, srv.URL, "k1", body)
	if err != nil || r2.StatusCode != http.StatusCreated || b2 != b1 || r2.Header.Get("Idempotency-Replayed") != "true" {
		t.Fatalf("retry: %v %v %s, want the same 201 replayed", err, r2, b2)
	}
	if n := count(t, srv.URL); n != 1 {
		t.Errorf("count = %d, want 1", n)
	}
	resp, err := http.Get(srv.URL + "/v1/charges?reference=inv-1")
	if err != nil {
		t.Fatal(err)
	}
	var list struct{ Charges []provider.Charge }
	_ = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Charges) != 1 || list.Charges[0] != c {
		t.Errorf("list = %+v, want [%+v]", list.Charges, c)
	}
	for _, bad := range []struct{ key, body string }{
		{"", body}, // the key is required
		{"k2", `{"amountCents":0,"currency":"USD","reference":"x"}`},
		{"k3", `{"amountCents":1,"currency":"usd","reference":"x"}`},
		{"k4", `{"amountCents":1,"currency":"USD"}`},
	} {
		r, b, err := charge(t, srv.URL, bad.key, bad.body)
		if err != nil || r.StatusCode != http.StatusBadRequest {
			t.Errorf("key %q body %s: %v %v %s, want 400", bad.key, bad.body, err, r, b)
		}
	}
	if n := count(t, srv.URL); n != 1 {
		t.Errorf("count after refused charges = %d, want 1", n)
	}
}

func TestFailRateChargesNothing(t *testing.T) {
	t.Parallel()
	srv := newProvider(t, provider.Config{FailRate: 1})
	r, b, err := charge(t, srv.URL, "k", body)
	if err != nil || r.StatusCode != http.StatusServiceUnavailable || !strings.Contains(b, "provider.unavailable") {
		t.Fatalf("%v %v %s, want 503", err, r, b)
	}
	if n := count(t, srv.URL); n != 0 {
		t.Errorf("count = %d, want 0", n)
	}
}

// A dropped answer: the charge commits, the connection closes without a
// response; the retry with the same key gets the charge, once.
func TestDropRateCommitsThenLosesTheAnswer(t *testing.T) {
	t.Parallel()
	store, err := sqlitestore.Open(t.Context(), filepath.Join(t.TempDir(), "p.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	logs := &logBuffer{}
	dropping, err := provider.New(t.Context(), store, provider.Config{DropRate: 1, Logger: logs.logger()})
	if err != nil {
		t.Fatal(err)
	}
	answering, err := provider.New(t.Context(), store, provider.Config{})
	if err != nil {
		t.Fatal(err)
	}
	d := httptest.NewServer(dropping.Handler())
	defer d.Close()
	a := httptest.NewServer(answering.Handler())
	defer a.Close()
	if r, b, err := charge(t, d.URL, "k", body); err == nil {
		t.Fatalf("a dropped charge got an answer: %v %s", r.StatusCode, b)
	}
	// The provider says what it dropped, the key redacted.
	line := logs.String()
	if !strings.Contains(line, "dropped the answer") || !strings.Contains(line, "status=201") || !strings.Contains(line, "charge=ch_") ||
		!strings.Contains(line, idem.RedactKey("k")) || strings.Contains(line, "key=k ") {
		t.Errorf("log of the dropped answer: %q", line)
	}
	if n := count(t, a.URL); n != 1 {
		t.Fatalf("count after a dropped answer = %d, want 1 (committed)", n)
	}
	r, b, err := charge(t, a.URL, "k", body)
	if err != nil || r.StatusCode != http.StatusCreated || r.Header.Get("Idempotency-Replayed") != "true" {
		t.Fatalf("retry: %v %v %s, want the stored 201", err, r, b)
	}
	if n := count(t, a.URL); n != 1 {
		t.Errorf("count after the retry = %d, want 1", n)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	store, err := sqlitestore.Open(t.Context(), filepath.Join(t.TempDir(), "p.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for _, c := range []provider.Config{{FailRate: -0.1}, {FailRate: 1.1}, {DropRate: 2}, {DeclineRate: 1.5}, {DeclineRate: math.NaN()}, {Delay: -1}} {
		if _, err := provider.New(t.Context(), store, c); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// A declined charge is an answer like a charge: 402 card_declined, stored
// with the key (a retry gets the same decline, replayed), nothing charged,
// and logged.
func TestDeclineRateDeclinesForGood(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	srv := newProvider(t, provider.Config{DeclineRate: 1, Logger: logs.logger()})
	r1, b1, err := charge(t, srv.URL, "k", body)
	if err != nil || r1.StatusCode != http.StatusPaymentRequired || !strings.Contains(b1, `"code":"card_declined"`) ||
		r1.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%v %v %s, want 402 card_declined", err, r1, b1)
	}
	r2, b2, err := charge(t, srv.URL, "k", body)
	if err != nil || r2.StatusCode != http.StatusPaymentRequired || b2 != b1 || r2.Header.Get("Idempotency-Replayed") != "true" {
		t.Fatalf("retry: %v %v %s, want the stored decline", err, r2, b2)
	}
	if n := count(t, srv.URL); n != 0 {
		t.Errorf("count = %d, want 0", n)
	}
	if n := strings.Count(logs.String(), "declined the charge"); n != 1 {
		t.Errorf("%d log lines for one decline:\n%s", n, logs.String())
	}
}
