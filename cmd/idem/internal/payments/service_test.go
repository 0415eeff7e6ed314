package payments

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// newServer serves POST /api/payments as idem serve does: the service
// behind the middleware on store.
func newServer(t *testing.T, store idemstore.Store, repo Repo) *httptest.Server {
	t.Helper()
	mw, err := idem.NewMiddleware(store, &idem.Config{TenantFunc: Tenant, FingerprintFunc: Fingerprint, MaxRequestBody: MaxBody})
	if err != nil {
		t.Fatal(err)
	}
	svc := &Service{Repo: repo}
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(svc.Create)))
	t.Cleanup(srv.Close)
	return srv
}

type result struct {
	status int
	header http.Header
	body   string
}

func (r result) code() string {
	var p struct{ Code string }
	_ = json.Unmarshal([]byte(r.body), &p)
	return p.Code
}

func post(t *testing.T, url, contentType, key, body string) result {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set(idem.HeaderKey, idem.FormatKey(key))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header, string(b)}
}

// countingRepo is an in-memory Repo for the handler's tests.
type countingRepo struct{ inserts int }

func (*countingRepo) Migrate(context.Context) error { return nil }
func (r *countingRepo) Insert(_ context.Context, p Payment) (Payment, error) {
	r.inserts++
	return p, nil
}
func (*countingRepo) Get(context.Context, string, string) (Payment, error) {
	return Payment{}, ErrNotFound
}
func (r *countingRepo) Count(context.Context) (int64, error) { return int64(r.inserts), nil }

// A body not declared JSON is answered 415 before the key is claimed: the
// same key then works with the right Content-Type.
func TestCreateRequiresJSONContentType(t *testing.T) {
	t.Parallel()
	store, _ := memstore.New(nil)
	repo := &countingRepo{}
	srv := newServer(t, store, repo)
	body := `{"amountCents":100,"currency":"USD","reference":"order-1"}`
	for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "", "application/jsonx", "json"} {
		r := post(t, srv.URL, ct, "k-415", body)
		if r.status != http.StatusUnsupportedMediaType || r.code() != "payment.unsupported_media_type" {
			t.Errorf("Content-Type %q: %d %s, want 415", ct, r.status, r.body)
		}
	}
	for i, ct := range []string{"application/json", "application/json; charset=utf-8", "application/merchant+json"} {
		r := post(t, srv.URL, ct, "k-415-"+string(rune('a'+i)), body)
		if r.status != http.StatusCreated {
			t.Errorf("Content-Type %q: %d %s, want 201", ct, r.status, r.body)
		}
	}
	if r := post(t, srv.URL, "application/json", "k-415", body); r.status != http.StatusCreated {
		t.Errorf("the key refused with 415 was consumed: %d %s", r.status, r.body)
	}
	// Outside the middleware too.
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/api/payments", strings.NewReader(body))
	req.Header.Set("Content-Type", "text/plain")
	(&Service{Repo: repo}).Create(rec, req)
	if rec.Code != http.StatusUnsupportedMediaType {
		t.Errorf("without the middleware: %d", rec.Code)
	}
	if repo.inserts != 4 {
		t.Errorf("%d inserts, want 4", repo.inserts)
	}
}

// A control character in the reference (NUL, which PostgreSQL text
// cannot hold, among them) is a 400 from validation, on every store.
func TestCreateRefusesControlCharacters(t *testing.T) {
	t.Parallel()
	store, _ := memstore.New(nil)
	repo := &countingRepo{}
	srv := newServer(t, store, repo)
	for i, ref := range []string{`a\u0000b`, `a\u0007b`, `line\nbreak`, `a\u007fb`, `a\u0085b`} {
		r := post(t, srv.URL, "application/json", "k-ctl-"+string(rune('a'+i)), `{"amountCents":100,"currency":"USD","reference":"`+ref+`"}`)
		if r.status != http.StatusBadRequest || !strings.Contains(r.body, "control characters") {
			t.Errorf("reference %s: %d %s, want 400", ref, r.status, r.body)
		}
	}
	if repo.inserts != 0 {
		t.Errorf("%d inserts", repo.inserts)
	}
}

// pgSchema returns a pool whose search_path is a fresh schema (dropped
// when the test ends), for the payments table and the records.
func pgSchema(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	dsn := os.Getenv("IDEM_TEST_POSTGRES_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	admin, err := pgxpool.New(ctx, dsn)
	if err == nil {
		err = admin.Ping(ctx)
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("PostgreSQL unreachable (CI is set): %v", err)
		}
		t.Skipf("PostgreSQL unreachable: %v", err)
	}
	t.Cleanup(admin.Close)
	schema := "paytest_" + strings.ToLower(rand.Text()[:10])
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, schema
}

// A payment the database refuses as invalid (here a CHECK constraint the
// validation knows nothing of) is a 422 that is stored with the record in
// the execution's transaction and replayed, not a 503 to retry forever.
func TestCreateDatabaseRefusalIsStored(t *testing.T) {
	t.Parallel()
	pool, schema := pgSchema(t)
	ctx := context.Background()
	repo := PostgresRepo{Pool: pool}
	if err := repo.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ALTER TABLE payments ADD CONSTRAINT small_amounts CHECK (amount_cents < 1000)`); err != nil {
		t.Fatal(err)
	}
	store, err := pgstore.New(ctx, pool, &pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, store, repo)
	big := `{"amountCents":5000,"currency":"USD","reference":"too-big"}`
	first := post(t, srv.URL, "application/json", "refused", big)
	if first.status != http.StatusUnprocessableEntity || first.code() != "payment.rejected" || !strings.Contains(first.body, "small_amounts") {
		t.Fatalf("refused payment: %d %s, want 422 payment.rejected", first.status, first.body)
	}
	again := post(t, srv.URL, "application/json", "refused", big)
	if again.status != first.status || again.body != first.body || again.header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %s (replayed %q), want the stored 422", again.status, again.body, again.header.Get(idem.HeaderReplayed))
	}
	// The transaction survived the refusal: a valid payment goes through.
	if ok := post(t, srv.URL, "application/json", "accepted", `{"amountCents":500,"currency":"USD","reference":"fine"}`); ok.status != http.StatusCreated {
		t.Fatalf("valid payment: %d %s", ok.status, ok.body)
	}
	if n, err := repo.Count(ctx); err != nil || n != 1 {
		t.Fatalf("%d payments (%v), want 1", n, err)
	}
}

// The same on SQLite: a payment the database refuses (a CHECK of the
// application's) is a stored 422, in the execution's transaction.
func TestCreateDatabaseRefusalIsStoredSQLite(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := openSQLite(t)
	// The application's own table, with a constraint the validation does
	// not know; Migrate then leaves it as it is.
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE payments (
		id TEXT PRIMARY KEY, tenant TEXT NOT NULL, idempotency_key TEXT NOT NULL,
		amount_cents INTEGER NOT NULL CONSTRAINT small_amounts CHECK (amount_cents < 1000),
		currency TEXT NOT NULL, reference TEXT NOT NULL, created_at TEXT NOT NULL,
		UNIQUE (tenant, idempotency_key))`); err != nil {
		t.Fatal(err)
	}
	repo := SQLiteRepo{Store: store}
	if err := repo.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, store, repo)
	big := `{"amountCents":5000,"currency":"USD","reference":"too-big"}`
	first := post(t, srv.URL, "application/json", "refused", big)
	if first.status != http.StatusUnprocessableEntity || first.code() != "payment.rejected" {
		t.Fatalf("refused payment: %d %s, want 422 payment.rejected", first.status, first.body)
	}
	again := post(t, srv.URL, "application/json", "refused", big)
	if again.status != first.status || again.body != first.body || again.header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %s (replayed %q), want the stored 422", again.status, again.body, again.header.Get(idem.HeaderReplayed))
	}
	if ok := post(t, srv.URL, "application/json", "accepted", `{"amountCents":500,"currency":"USD","reference":"fine"}`); ok.status != http.StatusCreated {
		t.Fatalf("valid payment: %d %s", ok.status, ok.body)
	}
	if n, err := repo.Count(ctx); err != nil || n != 1 {
		t.Fatalf("%d payments (%v), want 1", n, err)
	}
}
