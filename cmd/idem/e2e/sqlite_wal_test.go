package e2e

import (
	"bytes"
	"database/sql"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/idemhq/idem/cmd/idem/internal/sqlitewal"
)

// walCommits counts the transactions committed to the SQLite database at
// path since its write-ahead log last restarted (see sqlitewal.Read).
func walCommits(t *testing.T, path string) int {
	t.Helper()
	c, err := sqlitewal.Read(path)
	if err != nil {
		t.Fatalf("read the WAL: %v", err)
	}
	return c.Commits
}

// On SQLite a first execution of idem serve's payments costs exactly one
// write transaction (--claim-in-tx, the default): the claim, the payment,
// the record's completion and the stored response. With separate claims
// (--claim-in-tx=false, or --op-delay, which stands for work outside the
// database) it costs two: the claim, committed on its own so that
// duplicates see it at once, then the rest. A replay, a 422 and an invalid
// payload write nothing in either mode.
func TestSQLiteFirstExecutionCommits(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name  string
		flags []string
		first int
	}{
		{"claim-in-tx", nil, 1},
		{"separate-claim", []string{"--claim-in-tx=false"}, 2},
		{"op-delay", []string{"--op-delay", "1ms"}, 2},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "idem.db")
			s := startServer(t, "sqlite-tx-"+mode.name, append([]string{"--db", path}, mode.flags...)...)
			key := "tx-" + randomName(8)
			body := paymentBody(990, "order-"+key)

			steps := []struct {
				name    string
				body    string
				status  int
				commits int
			}{
				{"first execution", body, http.StatusCreated, mode.first},
				{"replay", body, http.StatusCreated, 0},
				{"another payload", paymentBody(991, "order-"+key), http.StatusUnprocessableEntity, 0},
			}
			for _, st := range steps {
				before := walCommits(t, path)
				r := mustPay(t, s, key, st.body)
				if r.status != st.status {
					t.Fatalf("%s: %v, want %d", st.name, r, st.status)
				}
				if got := walCommits(t, path) - before; got != st.commits {
					t.Errorf("%s committed %d write transactions, want %d", st.name, got, st.commits)
				}
			}
			before := walCommits(t, path)
			if r := mustPay(t, s, "tx-invalid-"+randomName(8), `{"amountCents":0,"currency":"USD","reference":"x"}`); r.status != http.StatusBadRequest {
				t.Fatalf("invalid payload: %v, want 400", r)
			}
			if got := walCommits(t, path) - before; got != 0 {
				t.Errorf("an invalid payload committed %d write transactions, want 0 (validated before the claim)", got)
			}
			if n := sqliteCount(t, path); n != 1 {
				t.Errorf("%d payments, want 1", n)
			}
		})
	}
}

// A database created by the previous binary, whose payments table held
// the uniqueness of (tenant, idempotency_key) as a table constraint, is
// migrated by idem serve (records in the same file: the constraint goes)
// and keeps its payments; a key used before pays again under a new record.
func TestSQLiteServeMigratesOldPaymentsTable(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "old.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE payments (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, idempotency_key TEXT NOT NULL,
			amount_cents INTEGER NOT NULL, currency TEXT NOT NULL, reference TEXT NOT NULL, created_at TEXT NOT NULL,
			UNIQUE (tenant, idempotency_key))`,
		`INSERT INTO payments VALUES ('pay_old', 'anonymous', 'old-key', 100, 'USD', 'old', '2026-12-01T00:00:00Z')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	s := startServer(t, "sqlite-old-table", "--db", path)
	for i, key := range []string{"new-" + randomName(8), "old-key"} {
		if r := mustPay(t, s, key, paymentBody(100+i, "order-"+key)); r.status != http.StatusCreated || bytes.Contains(r.body, []byte("pay_old")) {
			t.Fatalf("payment with key %s on the old table: %v, want a new payment (201)", key, r)
		}
	}
	if n := sqliteCount(t, path); n != 3 {
		t.Errorf("%d payments, want the old one and two new", n)
	}
}
