package e2e

import (
	"net/http"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idemhq/idem"
)

// Two instances with records in one Redis (payments in one PostgreSQL
// database, so that both see every payment) are one service: simultaneous
// duplicates spread over them execute once.
func TestRedisDuplicatesAcrossInstances(t *testing.T) {
	t.Parallel()
	rp := newRedisPrefix(t)
	db := newPGDatabase(t)
	store := rp.storeURL("")
	a := startServer(t, "redis-a", "--db", db.url, "--store", store, "--op-delay", "2s")
	b := startServer(t, "redis-b", "--db", db.url, "--store", store, "--op-delay", "2s")
	servers := []*server{a, b}
	key := "dup-" + randomName(8)
	body := paymentBody(1999, "order-"+key)

	executed := checkBurst(t, servers, burst(t, servers, 48, key, body))
	checkOnePayment(t, db, executed, servers...)
	// The records went to Redis, under this test's prefix, and not to
	// PostgreSQL.
	if n, err := rp.keys(testContext(t)); err != nil || n == 0 {
		t.Errorf("keys under %s: %d (%v), want at least 1", rp.prefix, n, err)
	}
	if n := db.recordCount(t); n != 0 {
		t.Errorf("%d idempotency records in PostgreSQL, want 0 (they belong in Redis)", n)
	}
	for _, s := range servers {
		checkReplay(t, executed, mustPay(t, s, key, body))
	}
}

// With Redis unreachable, a request is refused with 503
// idempotency.store_unavailable and its operation does not run; when Redis
// is back, the same process serves again without a restart, and the
// refused request's retry executes once. Redis is made unreachable by
// cutting a TCP proxy between idem serve and the shared server.
func TestRedisUnreachable(t *testing.T) {
	t.Parallel()
	rp := newRedisPrefix(t)
	proxy := newTCPProxy(t, rp.addr())
	dbPath := filepath.Join(t.TempDir(), "payments.db")
	s := startServer(t, "redis-proxied", "--db", dbPath, "--store", rp.storeURL(proxy.addr()))
	key1, key2 := "before-"+randomName(8), "during-"+randomName(8)
	body1, body2 := paymentBody(100, "order-"+key1), paymentBody(200, "order-"+key2)

	first := mustPay(t, s, key1, body1)
	if first.status != http.StatusCreated || first.replayed() != "false" {
		t.Fatalf("payment with Redis reachable: %v", first)
	}

	proxy.cut()
	cutAt := time.Now()
	refused := mustPay(t, s, key2, body2)
	refusedIn := time.Since(cutAt)
	checkUnavailable(t, refused)
	// A completed key cannot be replayed either, and is not run again.
	checkUnavailable(t, mustPay(t, s, key1, body1))
	if h := get(t, s, "/healthz"); h.status != http.StatusServiceUnavailable {
		t.Errorf("/healthz with Redis unreachable: %v", h)
	}
	if n := apiCount(t, s); n != 1 {
		t.Errorf("GET /api/payments/count = %d with Redis unreachable, want 1", n)
	}
	if n := sqliteCount(t, dbPath); n != 1 {
		t.Errorf("%d payments in the SQLite file with Redis unreachable, want 1", n)
	}
	if n := s.mustMetric(t, "idem_executions_total"); n != 1 {
		t.Errorf("idem_executions_total = %v with Redis unreachable, want 1", n)
	}
	if n := s.mustMetric(t, "idem_store_unavailable_total"); n != 2 {
		t.Errorf("idem_store_unavailable_total = %v, want 2", n)
	}

	proxy.restore()
	restoredAt := time.Now()
	eventually(t, 30*time.Second, 20*time.Millisecond, "/healthz answers 200 again", func() (bool, error) {
		return get(t, s, "/healthz").status == http.StatusOK, nil
	})
	recoveredIn := time.Since(restoredAt)
	retried := mustPay(t, s, key2, body2)
	if retried.status != http.StatusCreated || retried.replayed() != "false" {
		t.Fatalf("retry of the refused request after Redis returned: %v", retried)
	}
	checkReplay(t, retried, mustPay(t, s, key2, body2))
	checkReplay(t, first, mustPay(t, s, key1, body1))
	if n := sqliteCount(t, dbPath); n != 2 {
		t.Errorf("%d payments, want 2", n)
	}
	if n := s.mustMetric(t, "idem_executions_total"); n != 2 {
		t.Errorf("idem_executions_total = %v, want 2", n)
	}
	t.Logf("503 came %v after the cut; /healthz was 200 again %v after the restore", refusedIn.Round(time.Millisecond), recoveredIn.Round(time.Millisecond))
}

// checkUnavailable checks r is 503 idempotency.store_unavailable with
// Retry-After.
func checkUnavailable(t *testing.T, r reply) {
	t.Helper()
	if r.status != http.StatusServiceUnavailable || r.problemCode() != idem.CodeStoreUnavailable {
		t.Errorf("with Redis unreachable: %v, want 503 %s", r, idem.CodeStoreUnavailable)
	}
	if ra, err := strconv.Atoi(r.header.Get("Retry-After")); err != nil || ra <= 0 {
		t.Errorf("503 without a positive Retry-After: %v", r.header)
	}
}
