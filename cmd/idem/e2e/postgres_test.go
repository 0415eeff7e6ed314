package e2e

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/idemhq/idem"
)

// recordCount returns the number of idempotency records in the database's
// default records table (schema idem).
func (db *pgDatabase) recordCount(t *testing.T) int64 {
	t.Helper()
	var n int64
	if err := db.pool.QueryRow(testContext(t), "SELECT count(*) FROM idem.idempotency_records").Scan(&n); err != nil {
		t.Fatalf("count records in %s: %v", db.name, err)
	}
	return n
}

// checkOnePayment checks that the database holds exactly the payment of
// executed, and that every server reports one payment.
func checkOnePayment(t *testing.T, db sqlDatabase, executed reply, servers ...*server) {
	t.Helper()
	if ids, want := db.paymentIDs(t), executed.paymentID(t); !slices.Equal(ids, []string{want}) {
		t.Errorf("payments table holds %v, want exactly [%s]", ids, want)
	}
	for _, s := range servers {
		if n := apiCount(t, s); n != 1 {
			t.Errorf("%s: GET /api/payments/count = %d, want 1", s.name, n)
		}
	}
}

// Several instances on one database are one service: simultaneous
// duplicates spread over them execute once; the rest get 409 while it
// runs, then replays from any instance.
func TestPostgresDuplicatesAcrossInstances(t *testing.T) {
	t.Parallel()
	testDuplicatesAcrossInstances(t, newPGDatabase(t), "pg")
}

func TestMySQLDuplicatesAcrossInstances(t *testing.T) {
	t.Parallel()
	testDuplicatesAcrossInstances(t, newMyDatabase(t), "mysql")
}

func testDuplicatesAcrossInstances(t *testing.T, db sqlDatabase, prefix string) {
	var servers []*server
	for i := range 3 {
		servers = append(servers, startServer(t, fmt.Sprintf("%s-%d", prefix, i+1), "--db", db.dbURL(), "--op-delay", "2s"))
	}
	key := "dup-" + randomName(8)
	body := paymentBody(4200, "order-"+key)

	executed := checkBurst(t, servers, burst(t, servers, 48, key, body))
	checkOnePayment(t, db, executed, servers...)
	if n := db.recordCount(t); n != 1 {
		t.Errorf("%d idempotency records in the database, want 1", n)
	}
	for _, s := range servers {
		checkReplay(t, executed, mustPay(t, s, key, body))
	}
	var total float64
	for _, s := range servers {
		total += s.mustMetric(t, "idem_executions_total")
	}
	if total != 1 {
		t.Errorf("executions after the replays: %v, want 1", total)
	}
}

// An instance killed with SIGKILL in the middle of an operation leaves no
// payment; its key stays claimed until the lease runs out, then another
// instance executes the retry exactly once, and every instance (including
// the restarted one) replays the same bytes.
func TestPostgresKillMidOperation(t *testing.T) {
	t.Parallel()
	testKillMidOperation(t, newPGDatabase(t), "pg")
}

func TestMySQLKillMidOperation(t *testing.T) {
	t.Parallel()
	testKillMidOperation(t, newMyDatabase(t), "mysql")
}

func testKillMidOperation(t *testing.T, db sqlDatabase, prefix string) {
	// The doomed instance's operation takes far longer than the test
	// needs to kill it; the survivor's runs at once.
	a := startServer(t, prefix+"-doomed", "--db", db.dbURL(), "--lease", "1s", "--op-delay", "60s")
	b := startServer(t, prefix+"-survivor", "--db", db.dbURL(), "--lease", "1s")
	key := "crash-" + randomName(8)
	body := paymentBody(777, "order-"+key)

	doomed := make(chan error, 1)
	go func() {
		_, err := pay(&http.Client{Timeout: 90 * time.Second}, a, key, body)
		doomed <- err
	}()
	eventually(t, 30*time.Second, 10*time.Millisecond, "the operation runs on "+a.name, func() (bool, error) {
		v, err := a.metric("idem_operations_in_flight")
		return v == 1, err
	})
	a.kill(t)
	killedAt := time.Now()
	if err := <-doomed; err == nil {
		t.Fatal("the request to the killed instance got a response")
	}
	if n := db.count(t); n != 0 {
		t.Fatalf("the killed operation left %d payments", n)
	}

	// Retry on the survivor until the dead owner's lease runs out.
	var executed reply
	conflicts := 0
	eventually(t, 30*time.Second, 50*time.Millisecond, "the retry executes on "+b.name, func() (bool, error) {
		r, err := pay(httpClient, b, key, body)
		switch {
		case err != nil:
			return false, err
		case r.status == http.StatusConflict && r.problemCode() == idem.CodeRequestInProgress && r.header.Get("Retry-After") != "":
			conflicts++
			return false, nil
		case r.status == http.StatusCreated:
			executed = r
			return true, nil
		}
		t.Fatalf("retry after the crash: %v", r)
		return false, nil
	})
	took := time.Since(killedAt)
	if executed.replayed() != "false" {
		t.Fatalf("the retry after the crash was not an execution: %v", executed)
	}
	if conflicts == 0 {
		t.Errorf("the first retry after the kill executed at once: the dead owner's claim did not hold the key until its lease ran out")
	}
	t.Logf("retry executed on %s %v after the kill, after %d x 409", b.name, took.Round(time.Millisecond), conflicts)
	checkOnePayment(t, db, executed, b)
	if n := b.mustMetric(t, "idem_executions_total"); n != 1 {
		t.Errorf("%s executed %v times, want 1", b.name, n)
	}

	// A restarted instance and the survivor replay the same bytes.
	a2 := startServer(t, prefix+"-restarted", "--db", db.dbURL(), "--lease", "1s")
	fromRestarted := rawPay(t, a2, key, body)
	fromSurvivor := rawPay(t, b, key, body)
	if !bytes.Equal(fromRestarted, fromSurvivor) {
		t.Errorf("replays differ:\n%s:\n%s\n%s:\n%s", a2.name, fromRestarted, b.name, fromSurvivor)
	}
	checkReplay(t, executed, parseRaw(t, a2.name, fromRestarted))
	checkOnePayment(t, db, executed, a2, b)
	if n := a2.mustMetric(t, "idem_executions_total") + b.mustMetric(t, "idem_executions_total"); n != 1 {
		t.Errorf("executions after the replays: %v, want 1", n)
	}
}

// A replay is the same bytes (status line, every header field but Date,
// body) from whichever instance answers it; the original differs only in
// Idempotency-Replayed. Keys are per tenant across instances, and the
// fingerprint check holds across instances.
func TestPostgresReplayIdenticalAcrossInstances(t *testing.T) {
	t.Parallel()
	testReplayIdenticalAcrossInstances(t, newPGDatabase(t), "pg")
}

func TestMySQLReplayIdenticalAcrossInstances(t *testing.T) {
	t.Parallel()
	testReplayIdenticalAcrossInstances(t, newMyDatabase(t), "mysql")
}

func testReplayIdenticalAcrossInstances(t *testing.T, db sqlDatabase, prefix string) {
	a := startServer(t, prefix+"-a", "--db", db.dbURL())
	b := startServer(t, prefix+"-b", "--db", db.dbURL())
	key := "replay-" + randomName(8)
	body := paymentBody(2599, "order-"+key)
	tenant := []string{"Authorization", "Bearer tenant-" + randomName(4)}

	originalRaw := rawPay(t, a, key, body, tenant...)
	original := parseRaw(t, a.name, originalRaw)
	if original.status != http.StatusCreated || original.replayed() != "false" {
		t.Fatalf("first request: %v", original)
	}
	fromA := rawPay(t, a, key, body, tenant...)
	fromB := rawPay(t, b, key, body, tenant...)
	if !bytes.Equal(fromA, fromB) {
		t.Errorf("replays differ:\n%s:\n%s\n%s:\n%s", a.name, fromA, b.name, fromB)
	}
	checkReplay(t, original, parseRaw(t, b.name, fromB))
	want := bytes.Replace(originalRaw, []byte(idem.HeaderReplayed+": false\r\n"), []byte(idem.HeaderReplayed+": true\r\n"), 1)
	if !bytes.Equal(want, fromB) {
		t.Errorf("the replay is not the original's bytes with %s: true:\noriginal:\n%s\nreplay:\n%s", idem.HeaderReplayed, originalRaw, fromB)
	}

	// The same key from another tenant, on the other instance, is another
	// request: it executes.
	other := []string{"Authorization", "Bearer other-" + randomName(4)}
	r := mustPay(t, b, key, body, other...)
	if r.status != http.StatusCreated || r.replayed() != "false" {
		t.Fatalf("same key, other tenant: %v", r)
	}
	id := original.paymentID(t)
	if r.paymentID(t) == id {
		t.Fatalf("another tenant's request got the first tenant's payment %s", id)
	}
	// A payment is visible to its tenant only, from either instance.
	if g := get(t, b, "/api/payments/"+id, tenant...); g.status != http.StatusOK {
		t.Errorf("the tenant's own payment from %s: %v", b.name, g)
	}
	if g := get(t, b, "/api/payments/"+id, other...); g.status != http.StatusNotFound {
		t.Errorf("another tenant's payment from %s: %v", b.name, g)
	}
	// The key with another payload: 422 on the instance that did not run it.
	if r := mustPay(t, b, key, paymentBody(1, "other"), tenant...); r.status != http.StatusUnprocessableEntity || r.problemCode() != idem.CodeKeyReused {
		t.Errorf("same key, other payload: %v", r)
	}
	if n := db.count(t); n != 2 {
		t.Errorf("%d payments, want 2 (one per tenant)", n)
	}
}

// The payment and the record's completion (with its stored response) are
// written by one transaction. PostgreSQL stamps a row version with the ID
// of the (sub)transaction that wrote it (xmin). The demo inserts the
// payment under a savepoint (so that a refused payment leaves the
// transaction usable to store its 422), and a subtransaction's ID is
// assigned after its parent's: the payment's xmin is then above the
// record's. A payment committed in a transaction of its own, before the
// record was completed in another, would carry the lower ID.
func TestPostgresPaymentAndRecordCommitTogether(t *testing.T) {
	t.Parallel()
	db := newPGDatabase(t)
	s := startServer(t, "pg-tx", "--db", db.url)
	key := "tx-" + randomName(8)
	r := mustPay(t, s, key, paymentBody(1250, "order-"+key))
	if r.status != http.StatusCreated {
		t.Fatalf("first request: %v", r)
	}
	ctx := testContext(t)
	var paymentXmin, recordXmin string
	if err := db.pool.QueryRow(ctx, "SELECT xmin::text FROM payments WHERE id = $1", r.paymentID(t)).Scan(&paymentXmin); err != nil {
		t.Fatalf("payment row: %v", err)
	}
	if err := db.pool.QueryRow(ctx, "SELECT xmin::text FROM idem.idempotency_records WHERE key = $1 AND response IS NOT NULL", key).Scan(&recordXmin); err != nil {
		t.Fatalf("completed record: %v", err)
	}
	pay, err1 := strconv.ParseUint(paymentXmin, 10, 32)
	rec, err2 := strconv.ParseUint(recordXmin, 10, 32)
	if err1 != nil || err2 != nil {
		t.Fatalf("xmin %q, %q", paymentXmin, recordXmin)
	}
	if pay < rec {
		t.Errorf("the payment was written by transaction %d before the completed record's %d: not one transaction", pay, rec)
	}
}
