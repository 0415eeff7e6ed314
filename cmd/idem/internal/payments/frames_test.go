package payments

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/sqlitewal"
	"github.com/idemhq/idem/sqlitestore"
)

// walFrames returns the number of valid frames in the write-ahead log of
// the SQLite database at path (see sqlitewal.Read).
func walFrames(t testing.TB, path string) int {
	t.Helper()
	c, err := sqlitewal.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return c.Frames
}

// framesPerPayment makes warm first payments, then n more, through the
// middleware with its claim in the payment's transaction (as idem serve
// runs on SQLite), and returns the WAL frames each of the n wrote on
// average.
func framesPerPayment(t testing.TB, warm, n int) float64 {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "frames.db")
	store, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	// The writer is a single connection: the pragma holds for every commit.
	if _, err := store.DB().ExecContext(ctx, `PRAGMA wal_autocheckpoint = 0`); err != nil {
		t.Fatal(err)
	}
	repo := SQLiteRepo{Store: store, SameTx: true}
	if err := repo.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if repo, err = repo.Prepare(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { repo.Close() })
	mw, err := idem.NewMiddleware(store, &idem.Config{TenantFunc: Tenant, FingerprintFunc: Fingerprint, MaxRequestBody: MaxBody, ClaimInTx: true})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handle(http.HandlerFunc((&Service{Repo: repo}).Create))
	pay := func() {
		body := `{"amountCents":2599,"currency":"USD","reference":"order-1001"}`
		r := httptest.NewRequest(http.MethodPost, "/api/payments", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(idem.HeaderKey, idem.FormatKey(rand.Text()))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("payment: %d %s", w.Code, w.Body)
		}
	}
	for range warm {
		pay()
	}
	before := walFrames(t, path)
	for range n {
		pay()
	}
	logPagesByTree(t, store, path, before, n)
	return float64(walFrames(t, path)-before) / float64(n)
}

// logPagesByTree logs which B-trees the n payments after the first
// `before` frames of the log wrote their pages to, per payment: the
// table or index each page belongs to now (SQLite's dbstat), with its
// leaves and interior pages apart.
func logPagesByTree(t testing.TB, store *sqlitestore.Store, path string, before, n int) {
	t.Helper()
	pages, err := sqlitewal.ReadPages(path)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := store.DB().QueryContext(context.Background(), `SELECT name, pageno, pagetype FROM dbstat`)
	if err != nil {
		t.Fatal(err)
	}
	tree := map[uint32]string{}
	for rows.Next() {
		var name, kind string
		var page uint32
		if err := rows.Scan(&name, &page, &kind); err != nil {
			t.Fatal(err)
		}
		tree[page] = name + " " + kind
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		t.Fatal(err)
	}
	tree[1] = "page 1 (header and schema)"
	count := map[string]int{}
	for _, p := range pages[before:] {
		count[cmp.Or(tree[p], "unused")]++
	}
	for _, name := range slices.Sorted(maps.Keys(count)) {
		t.Logf("  %-40s %.2f", name, float64(count[name])/float64(n))
	}
}

// plainFramesPerInsert is the same measurement for the plain handler's
// insert (bench plain-payments): one row into a table whose only index is
// its primary key.
func plainFramesPerInsert(t testing.TB, warm, n int) float64 {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "plain.db")
	store, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	db := store.DB()
	for _, q := range []string{`PRAGMA wal_autocheckpoint = 0`, `CREATE TABLE plain_payments (id TEXT PRIMARY KEY, tenant TEXT NOT NULL,
		amount_cents INTEGER NOT NULL, currency TEXT NOT NULL, reference TEXT NOT NULL, created_at TEXT NOT NULL)`} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	insert := func() {
		if _, err := db.ExecContext(ctx, `INSERT INTO plain_payments VALUES (?, ?, ?, ?, ?, ?)`,
			newID(), "anonymous", 2599, "USD", "order-1001", time.Now().UTC().Format(time.RFC3339Nano)); err != nil {
			t.Fatal(err)
		}
	}
	for range warm {
		insert()
	}
	before := walFrames(t, path)
	for range n {
		insert()
	}
	return float64(walFrames(t, path)-before) / float64(n)
}

// TestSQLiteFramesPerPayment counts the pages (WAL frames) a first
// payment commits on SQLite, against the plain insert's: the write
// transaction's cost that the single writer serialises. The bound keeps
// what was cut from coming back (sqlitestore/BENCHMARKS.md): each of the
// fence counter's page, the in-flight index, the payments' unique index
// and a payments table with a rowid (withoutRowID) alone would exceed it.
func TestSQLiteFramesPerPayment(t *testing.T) {
	t.Parallel()
	const warm, n = 2000, 2000
	if testing.Short() {
		t.Skip("counts pages over 4,000 payments")
	}
	got := framesPerPayment(t, warm, n)
	plain := plainFramesPerInsert(t, warm, n)
	t.Logf("WAL frames per first payment: %.2f (plain insert: %.2f)", got, plain)
	if max := 6.2; got > max {
		t.Errorf("a first payment writes %.2f WAL frames, want at most %.1f", got, max)
	}
}
