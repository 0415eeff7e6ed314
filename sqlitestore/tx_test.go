package sqlitestore_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/sqlitestore"
)

// business creates the application's own table next to the records.
func business(t *testing.T, s *sqlitestore.Store) {
	t.Helper()
	if _, err := s.DB().Exec(`CREATE TABLE payments (id INTEGER PRIMARY KEY, note TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
}

func countPayments(t *testing.T, s *sqlitestore.Store) int {
	t.Helper()
	var n int
	if err := s.ReadDB().QueryRow(`SELECT COUNT(*) FROM payments`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

type observed struct {
	mu     sync.Mutex
	counts map[idem.EventKind]int
	notify chan struct{}
}

func newObserved() *observed {
	return &observed{counts: map[idem.EventKind]int{}, notify: make(chan struct{}, 1)}
}

func (o *observed) Observe(_ context.Context, e idem.Event) {
	o.mu.Lock()
	o.counts[e.Kind]++
	o.mu.Unlock()
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

func (o *observed) count(k idem.EventKind) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.counts[k]
}

func (o *observed) waitFor(t *testing.T, k idem.EventKind, n int) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for o.count(k) < n {
		select {
		case <-o.notify:
		case <-deadline:
			t.Fatalf("timed out waiting for %d %v events", n, k)
		}
	}
}

func post(t *testing.T, url, key, body string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

// payHandler inserts a payment through the execution's transaction and
// answers with the given status.
func payHandler(status *atomic.Int32) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tx, err := sqlitestore.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		res, err := tx.ExecContext(r.Context(), `INSERT INTO payments (note) VALUES ('paid')`)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		id, _ := res.LastInsertId()
		code := int(status.Load())
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"id":%d}`, id)
	}
}

func TestTransactionalMiddleware(t *testing.T) {
	t.Parallel()
	s, _ := open(t)
	business(t, s)
	var status atomic.Int32
	mw, err := idem.NewMiddleware(s, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handle(payHandler(&status)))
	defer srv.Close()

	// A 5xx rolls the business row back and frees the key.
	status.Store(500)
	if code, _, _ := post(t, srv.URL, "k", `{"a":1}`); code != 500 {
		t.Fatalf("first: %d", code)
	}
	if n := countPayments(t, s); n != 0 {
		t.Fatalf("%d payments after a 500, want 0: the business write was not rolled back", n)
	}
	// A 201 commits the business row and the response together.
	status.Store(201)
	code, body, _ := post(t, srv.URL, "k", `{"a":1}`)
	if code != 201 || countPayments(t, s) != 1 {
		t.Fatalf("retry: %d, %d payments", code, countPayments(t, s))
	}
	code2, body2, h := post(t, srv.URL, "k", `{"a":1}`)
	if code2 != 201 || body2 != body || h.Get(idem.HeaderReplayed) != "true" || countPayments(t, s) != 1 {
		t.Fatalf("replay: %d %s (%s), %d payments", code2, body2, h.Get(idem.HeaderReplayed), countPayments(t, s))
	}
}

func TestLostLeaseRollsBackBusinessWrite(t *testing.T) {
	t.Parallel()
	s, _ := open(t)
	business(t, s)
	ctx := context.Background()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	claim := idemstore.ClaimParams{Scope: "s", Key: "k", Fingerprint: "v1:x", Token: "stale", Lease: time.Second, TTL: time.Hour, Now: now}
	if r, err := s.Claim(ctx, claim); err != nil || r.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("claim: %v %v", r.Outcome, err)
	}
	// The lease runs out and another attempt takes over.
	claim.Token, claim.Now = "successor", now.Add(2*time.Second)
	if r, err := s.Claim(ctx, claim); err != nil || !r.TookOver {
		t.Fatalf("take-over: %+v %v", r, err)
	}
	// The stale owner's business write and completion share a transaction:
	// the token check fails and both roll back.
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`INSERT INTO payments (note) VALUES ('stale')`); err != nil {
		t.Fatal(err)
	}
	err = s.CompleteTx(ctx, tx, idemstore.CompleteParams{Scope: "s", Key: "k", Token: "stale",
		Response: &idemstore.Response{StatusCode: 201}, Now: now.Add(3 * time.Second)})
	if !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("CompleteTx of a stale owner: %v, want ErrLeaseLost", err)
	}
	tx.Rollback()
	if n := countPayments(t, s); n != 0 {
		t.Fatalf("%d payments remain from the stale owner", n)
	}
}

// TestSlowHandlerDoesNotBlockDuplicates holds the handler's transaction open
// for several lease periods: duplicates are answered 409 at once from the
// read path, and the lease is renewed through the open transaction.
func TestSlowHandlerDoesNotBlockDuplicates(t *testing.T) {
	t.Parallel()
	s, _ := open(t)
	business(t, s)
	obs := newObserved()
	lease := 150 * time.Millisecond
	mw, err := idem.NewMiddleware(s, &idem.Config{Lease: lease, Observer: obs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	inTx := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	defer once.Do(func() { close(release) })
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := sqlitestore.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		if _, err := tx.Exec(`INSERT INTO payments (note) VALUES ('slow')`); err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		close(inTx)
		<-release
		w.WriteHeader(201)
		io.WriteString(w, "done")
	})))
	defer srv.Close()

	done := make(chan int)
	go func() {
		code, _, _ := post(t, srv.URL, "slow", `{}`)
		done <- code
	}()
	<-inTx
	// Two full lease periods pass while the write transaction is open.
	obs.waitFor(t, idem.EventRenewed, 6)
	for range 3 {
		if code, _, h := post(t, srv.URL, "slow", `{}`); code != 409 || h.Get("Retry-After") == "" {
			t.Fatalf("duplicate while the owner holds the write lock: %d", code)
		}
	}
	once.Do(func() { close(release) })
	if code := <-done; code != 201 {
		t.Fatalf("owner: %d", code)
	}
	if obs.count(idem.EventLeaseLost) != 0 {
		t.Fatal("the owner lost its lease while holding the transaction")
	}
	if code, body, _ := post(t, srv.URL, "slow", `{}`); code != 201 || body != "done" {
		t.Fatalf("replay: %d %s", code, body)
	}
	if n := countPayments(t, s); n != 1 {
		t.Fatalf("%d payments", n)
	}
}

func TestOpenValidates(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, tc := range map[string]struct {
		path string
		cfg  *sqlitestore.Config
	}{
		"empty path":    {"", nil},
		"query in path": {dir + "/a?b.db", nil},
		"memory":        {":memory:", nil},
		"bad table":     {dir + "/x.db", &sqlitestore.Config{Table: "x; DROP TABLE y"}},
		"negative":      {dir + "/y.db", &sqlitestore.Config{BusyTimeout: -1}},
	} {
		if s, err := sqlitestore.Open(context.Background(), tc.path, tc.cfg); err == nil {
			s.Close()
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestReopenKeepsRecords(t *testing.T) {
	t.Parallel()
	s, path := open(t)
	ctx := context.Background()
	now := time.Now()
	p := idemstore.ClaimParams{Scope: "s", Key: "k", Fingerprint: "v1:x", Token: "t", Lease: time.Minute, TTL: time.Hour, Now: now}
	if _, err := s.Claim(ctx, p); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Scope: "s", Key: "k", Token: "t", Now: now,
		Response: &idemstore.Response{StatusCode: 201, Body: []byte("kept")}}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	again, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	p.Token = "t2"
	r, err := again.Claim(ctx, p)
	if err != nil || r.Outcome != idemstore.ClaimCompleted || string(r.Record.Response.Body) != "kept" {
		t.Fatalf("after reopening: %v %v", r.Outcome, err)
	}
}

func TestTxOutsideExecution(t *testing.T) {
	t.Parallel()
	if _, err := sqlitestore.Tx(context.Background()); !errors.Is(err, idem.ErrNoTx) {
		t.Fatalf("Tx outside an execution: %v", err)
	}
}
