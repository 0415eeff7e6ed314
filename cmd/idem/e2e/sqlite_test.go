package e2e

import (
	"database/sql"
	"net/http"
	"path/filepath"
	"testing"
)

// Two idem serve processes on one SQLite file are one service: simultaneous
// duplicates spread over them execute once.
func TestSQLiteDuplicatesAcrossProcesses(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	a := startServer(t, "sqlite-a", "--db", path, "--op-delay", "2s")
	b := startServer(t, "sqlite-b", "--db", path, "--op-delay", "2s")
	servers := []*server{a, b}
	key := "dup-" + randomName(8)
	body := paymentBody(3100, "order-"+key)

	executed := checkBurst(t, servers, burst(t, servers, 48, key, body))
	if n := sqliteCount(t, path); n != 1 {
		t.Errorf("%d payments in the SQLite file, want 1", n)
	}
	for _, s := range servers {
		if n := apiCount(t, s); n != 1 {
			t.Errorf("%s: GET /api/payments/count = %d, want 1", s.name, n)
		}
		checkReplay(t, executed, mustPay(t, s, key, body))
	}
}

// With --store naming another SQLite file, payments stay in --db and the
// records go to the other file: the records store's transaction must not
// reach the payments (they live elsewhere), and both requests succeed.
func TestSQLiteRecordsInAnotherFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	payments, records := filepath.Join(dir, "payments.db"), filepath.Join(dir, "records.db")
	s := startServer(t, "sqlite-split", "--db", payments, "--store", records)
	key := "split-" + randomName(8)
	body := paymentBody(4400, "order-"+key)
	first := mustPay(t, s, key, body)
	if first.status != http.StatusCreated {
		t.Fatalf("first request: %v", first)
	}
	checkReplay(t, first, mustPay(t, s, key, body))
	if n := sqliteCount(t, payments); n != 1 {
		t.Errorf("%d payments in %s, want 1", n, payments)
	}
	db, err := sql.Open("sqlite", "file:"+records+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRowContext(testContext(t), "SELECT count(*) FROM idem_records WHERE key = ?", key).Scan(&n); err != nil || n != 1 {
		t.Errorf("records in %s for the key: %d (%v), want 1", records, n, err)
	}
}
