package e2e

import (
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
