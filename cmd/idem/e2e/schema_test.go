package e2e

import (
	"database/sql"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
)

// Instances started at the same moment on a fresh PostgreSQL database all
// stay up: the demo's schema changes (the payments table, the provider
// columns, the outbox) take an advisory lock. Before, 1 to 3 of 4 such
// starts lost a race in the catalogue (type "payments" already exists) and
// exited. Several rounds, each on a fresh database; the provider columns
// (--provider) are migrated too, by half of the instances.
func TestPostgresInstancesStartTogether(t *testing.T) {
	t.Parallel()
	const rounds, instances = 3, 4
	for round := range rounds {
		db := newPGDatabase(t)
		began := time.Now()
		var servers []*server
		for i := range instances {
			args := []string{"serve", "--addr", "127.0.0.1:0", "--log-format", "json", "--db", db.url}
			if i%2 == 1 {
				// An address nothing listens on: the provider is only
				// called for payments, and this test makes none here.
				args = append(args, "--provider", "http://127.0.0.1:9", "--reconcile-interval", "0")
			}
			servers = append(servers, spawnIdem(t, fmt.Sprintf("round%d-pg%d", round, i), nil, args...))
		}
		for _, s := range servers {
			s.awaitListening(t, began)
		}
		key := "together-" + randomName(8)
		body := paymentBody(100, "order-"+key)
		if r := mustPay(t, servers[0], key, body); r.status != http.StatusCreated {
			t.Fatalf("round %d: payment: %v", round, r)
		}
		for _, s := range servers {
			select {
			case <-s.exited:
				t.Fatalf("round %d: %s exited (%v); log:\n%s", round, s.name, s.waitErr, s.log.tail(20))
			default:
			}
		}
	}
}

// The README's PostgreSQL snippet assumes a payments (reference text,
// amount_cents bigint) table; idem serve on that database used to answer
// every payment 503 without a log line. It now refuses to start, naming
// the table and what to do. The same for the README's SQLite snippet's
// table.
func TestServeRefusesForeignPaymentsTable(t *testing.T) {
	t.Parallel()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		db := newPGDatabase(t)
		if _, err := db.pool.Exec(testContext(t), `CREATE TABLE payments (reference text, amount_cents bigint)`); err != nil {
			t.Fatal(err)
		}
		code, out := runToExit(t, nil, "serve", "--addr", "127.0.0.1:0", "--db", db.url)
		checkRefusal(t, code, out, "public.payments")
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "app.db")
		sqliteExec(t, path, `CREATE TABLE payments (id INTEGER PRIMARY KEY, reference TEXT NOT NULL, amount_cents INTEGER NOT NULL)`)
		code, out := runToExit(t, nil, "serve", "--addr", "127.0.0.1:0", "--db", path)
		checkRefusal(t, code, out, "payments")
	})
}

func checkRefusal(t *testing.T, code int, out, table string) {
	t.Helper()
	if code == 0 {
		t.Fatalf("idem serve exited 0 on a foreign payments table:\n%s", out)
	}
	for _, want := range []string{"table " + table + " ", "not the payments table of idem serve", "no column", "tenant", "--db", "rename"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "listening") {
		t.Errorf("idem serve listened before refusing:\n%s", out)
	}
}

// A 503 the demo answers because its database refuses the insert (here
// the table was changed under the running service) has its cause in the
// log, with the key redacted.
func TestPostgresFailureCauseLogged(t *testing.T) {
	t.Parallel()
	db := newPGDatabase(t)
	s := startServer(t, "pg-cause", "--db", db.url)
	if r := mustPay(t, s, "before-"+randomName(8), paymentBody(100, "before")); r.status != http.StatusCreated {
		t.Fatalf("payment: %v", r)
	}
	if _, err := db.pool.Exec(testContext(t), `ALTER TABLE payments RENAME COLUMN reference TO ref`); err != nil {
		t.Fatal(err)
	}
	key := "cause-" + randomName(8)
	r := mustPay(t, s, key, paymentBody(200, "after"))
	if r.status != http.StatusServiceUnavailable || r.problemCode() != "payment.unavailable" {
		t.Fatalf("payment after the column's rename: %v, want 503 payment.unavailable", r)
	}
	line := s.log.waitLine(t, 10*time.Second, `"code":"payment.unavailable"`, `"level":"ERROR"`)
	for _, want := range []string{`"key":"` + idem.RedactKey(key) + `"`, `column \"reference\" of relation \"payments\" does not exist`, `"status":503`} {
		if !strings.Contains(line, want) {
			t.Errorf("the 503's log line lacks %s: %s", want, line)
		}
	}
	if s.log.contains(key) {
		t.Errorf("the log holds the key in clear")
	}
}

// sqliteExec runs stmt on the SQLite file at path (creating it).
func sqliteExec(t *testing.T, path, stmt string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.ExecContext(testContext(t), stmt); err != nil {
		t.Fatal(err)
	}
}
