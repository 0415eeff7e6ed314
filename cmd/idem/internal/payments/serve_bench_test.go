package payments

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/sqlitestore"
)

// sqliteServe returns idem serve's POST /api/payments in-process on a
// fresh SQLite file (middleware with ClaimInTx, service, repo).
func sqliteServe(b *testing.B) http.Handler {
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "serve.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { store.Close() })
	repo := SQLiteRepo{Store: store, SameTx: true}
	if err := repo.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if repo, err = repo.Prepare(ctx); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { repo.Close() })
	mw, err := idem.NewMiddleware(store, &idem.Config{TenantFunc: Tenant, FingerprintFunc: Fingerprint, MaxRequestBody: MaxBody, ClaimInTx: true})
	if err != nil {
		b.Fatal(err)
	}
	return mw.Handle(http.HandlerFunc((&Service{Repo: repo}).Create))
}

// servePayment sends one payment with key to h and checks its status.
func servePayment(b *testing.B, h http.Handler, key string, want int) {
	const body = `{"amountCents":2599,"currency":"USD","reference":"order-1001"}`
	r := httptest.NewRequest(http.MethodPost, "/api/payments", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set(idem.HeaderKey, idem.FormatKey(key))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != want {
		b.Fatalf("payment: %d %s", w.Code, w.Body)
	}
}

// BenchmarkSQLiteFirstPayment measures idem serve's first payment
// in-process on SQLite: one write transaction (claim, payment, record):
//
//	go test -run '^$' -bench SQLiteFirstPayment -benchmem ./internal/payments/
func BenchmarkSQLiteFirstPayment(b *testing.B) {
	h := sqliteServe(b)
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		n++
		servePayment(b, h, "first-"+strconv.Itoa(n), http.StatusCreated)
	}
}

// BenchmarkSQLiteReplay measures a replay of idem serve's payment
// in-process (middleware, service, SQLite records), the path the serve
// scenario compares with the plain primary-key read:
//
//	go test -run '^$' -bench SQLiteReplay -benchmem ./internal/payments/
func BenchmarkSQLiteReplay(b *testing.B) {
	h := sqliteServe(b)
	servePayment(b, h, "replayed", http.StatusCreated)
	b.ReportAllocs()
	for b.Loop() {
		servePayment(b, h, "replayed", http.StatusCreated)
	}
}
