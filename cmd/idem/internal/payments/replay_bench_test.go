package payments

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/sqlitestore"
)

// BenchmarkSQLiteReplay measures a replay of idem serve's payment
// in-process (middleware, service, SQLite records), the path the serve
// scenario compares with the plain primary-key read:
//
//	go test -run '^$' -bench SQLiteReplay -benchmem ./internal/payments/
func BenchmarkSQLiteReplay(b *testing.B) {
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "replay.db"), nil)
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
	h := mw.Handle(http.HandlerFunc((&Service{Repo: repo}).Create))
	const body = `{"amountCents":2599,"currency":"USD","reference":"order-1001"}`
	key := idem.FormatKey("replayed-key")
	pay := func(want int) {
		r := httptest.NewRequest(http.MethodPost, "/api/payments", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(idem.HeaderKey, key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			b.Fatalf("payment: %d %s", w.Code, w.Body)
		}
	}
	pay(http.StatusCreated)
	b.ReportAllocs()
	for b.Loop() {
		pay(http.StatusCreated)
	}
}
