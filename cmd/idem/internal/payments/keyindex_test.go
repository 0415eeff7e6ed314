package payments

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/sqlitestore"
)

// The payments table as idem serve created it before the unique index
// became conditional: the uniqueness of (tenant, idempotency_key) was a
// table constraint.
const (
	oldTableSQLite = `CREATE TABLE payments (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, idempotency_key TEXT NOT NULL,
		amount_cents INTEGER NOT NULL, currency TEXT NOT NULL, reference TEXT NOT NULL, created_at TEXT NOT NULL,
		UNIQUE (tenant, idempotency_key))`
	oldTablePG = `CREATE TABLE payments (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, idempotency_key TEXT NOT NULL,
		amount_cents BIGINT NOT NULL, currency TEXT NOT NULL, reference TEXT NOT NULL, created_at TIMESTAMPTZ NOT NULL,
		UNIQUE (tenant, idempotency_key))`
)

// keyIndexCase runs the migrations of the unique index on (tenant,
// idempotency_key) on a table created by the previous binary with one
// payment: with the records in the same transaction, Migrate removes the
// constraint and keeps the payment, and a key can pay again (after its
// record expired); with records elsewhere, Migrate refuses a table with
// such duplicates, and otherwise adds the index back, which Insert then
// relies on.
func keyIndexCase(t *testing.T, exec func(string) error, count func() int64, same, other Repo, dedupe string) {
	t.Helper()
	ctx := context.Background()
	pay := func(r Repo, id string) (Payment, error) {
		return r.Insert(ctx, Payment{ID: id, AmountCents: 100, Currency: "USD", Reference: "r",
			CreatedAt: time.Now().UTC().Truncate(time.Microsecond), tenant: "anonymous", key: "k"})
	}
	if err := exec(`INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at) VALUES ('pay_old', 'anonymous', 'k', 100, 'USD', 'r', '2026-12-01T00:00:00Z')`); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := same.Migrate(ctx); err != nil {
			t.Fatalf("Migrate with the records in the transaction: %v", err)
		}
	}
	if n := count(); n != 1 {
		t.Fatalf("%d payments after the migration, want the old one", n)
	}
	if p, err := pay(same, newID()); err != nil || p.ID == "pay_old" {
		t.Fatalf("a payment with a key used before: %v %v, want a new payment", p.ID, err)
	}
	if err := other.Migrate(ctx); err == nil || !strings.Contains(err.Error(), "two payments share a tenant and idempotency key") {
		t.Fatalf("Migrate with records elsewhere over duplicate keys: %v, want an error naming them", err)
	}
	if err := exec(dedupe); err != nil {
		t.Fatal(err)
	}
	if err := other.Migrate(ctx); err != nil {
		t.Fatalf("Migrate with the records elsewhere: %v", err)
	}
	if p, err := pay(other, newID()); err != nil || p.ID != "pay_old" {
		t.Fatalf("a re-execution with records elsewhere: %v %v, want the stored payment pay_old", p.ID, err)
	}
	if err := same.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pay(same, newID()); err != nil {
		t.Fatalf("after dropping the index again: %v", err)
	}
}

func TestSQLiteMigrateKeyIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "old.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	exec := func(q string) error { _, err := store.DB().ExecContext(ctx, q); return err }
	// With the first provider columns, which the table's copy must keep.
	if err := exec(oldTableSQLite + `; ALTER TABLE payments ADD COLUMN status TEXT; ALTER TABLE payments ADD COLUMN charge_id TEXT; ALTER TABLE payments ADD COLUMN provider_key TEXT`); err != nil {
		t.Fatal(err)
	}
	count := func() int64 {
		n, err := SQLiteRepo{Store: store}.Count(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	keyIndexCase(t, exec, count, SQLiteRepo{Store: store, SameTx: true}, SQLiteRepo{Store: store},
		`DELETE FROM payments WHERE id <> 'pay_old'`)
	if _, err := (SQLiteRepo{Store: store, SameTx: true}).MigrateSteps(ctx); err != nil {
		t.Fatal(err)
	}
	if err := exec(`INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at, status)
		VALUES ('pay_x', 'anonymous', 'k', 1, 'USD', 'r', '2026-12-01T00:00:00Z', 'pending')`); err != nil {
		t.Fatal(err)
	}
}

func TestPostgresMigrateKeyIndex(t *testing.T) {
	t.Parallel()
	pool, _ := pgSchema(t)
	ctx := context.Background()
	exec := func(q string) error { _, err := pool.Exec(ctx, q); return err }
	if err := exec(oldTablePG); err != nil {
		t.Fatal(err)
	}
	count := func() int64 {
		n, err := PostgresRepo{Pool: pool}.Count(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	keyIndexCase(t, exec, count, PostgresRepo{Pool: pool, SameTx: true}, PostgresRepo{Pool: pool},
		`DELETE FROM payments WHERE id <> 'pay_old'`)
}
