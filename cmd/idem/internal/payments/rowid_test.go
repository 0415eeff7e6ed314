package payments

import (
	"context"
	"testing"
	"time"

	"github.com/idemhq/idem/sqlitestore"
)

// withoutRowIDTable reports whether the payments table of store is a
// WITHOUT ROWID table.
func withoutRowIDTable(t *testing.T, store *sqlitestore.Store) bool {
	t.Helper()
	var wr bool
	if err := store.DB().QueryRowContext(context.Background(), `SELECT wr FROM pragma_table_list('payments')`).Scan(&wr); err != nil {
		t.Fatal(err)
	}
	return wr
}

// A new database gets a WITHOUT ROWID payments table; one whose table an
// earlier version created (a rowid table) keeps it, with its payments,
// and both kinds take payments and read them back, with the records in
// the payment's transaction and elsewhere, with and without the provider
// columns, migrated again at each restart.
func TestSQLiteTableWithoutRowID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// before is what the file holds before idem serve starts.
		before       string
		withoutRowID bool
	}{
		{"new", "", true},
		{"existing", createTable("INTEGER", "TEXT") + `; INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at)
			VALUES ('pay_old', 'anonymous', 'k-old', 100, 'USD', 'r', '2026-12-01T00:00:00Z')`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store := openSQLite(t)
			if tc.before != "" {
				if _, err := store.DB().ExecContext(ctx, tc.before); err != nil {
					t.Fatal(err)
				}
			}
			n := 0
			for _, sameTx := range []bool{true, false, true} {
				repo := SQLiteRepo{Store: store, SameTx: sameTx}
				if err := repo.Migrate(ctx); err != nil {
					t.Fatalf("Migrate (SameTx %v): %v", sameTx, err)
				}
				if got := withoutRowIDTable(t, store); got != tc.withoutRowID {
					t.Fatalf("after Migrate (SameTx %v): WITHOUT ROWID %v, want %v", sameTx, got, tc.withoutRowID)
				}
				repo, err := repo.Prepare(ctx)
				if err != nil {
					t.Fatal(err)
				}
				n++
				want := Payment{ID: newID(), AmountCents: int64(n), Currency: "USD", Reference: "r",
					CreatedAt: time.Now().UTC().Truncate(time.Microsecond), tenant: "anonymous", key: "k" + string(rune('0'+n))}
				if _, err := repo.Insert(ctx, want); err != nil {
					t.Fatalf("Insert (SameTx %v): %v", sameTx, err)
				}
				got, err := repo.Get(ctx, "anonymous", want.ID)
				if err != nil || got.ID != want.ID || got.AmountCents != want.AmountCents || !got.CreatedAt.Equal(want.CreatedAt) {
					t.Fatalf("Get (SameTx %v): %+v %v, want %+v", sameTx, got, err, want)
				}
				if tc.before != "" {
					if old, err := repo.Get(ctx, "anonymous", "pay_old"); err != nil || old.AmountCents != 100 {
						t.Fatalf("the payment made before: %+v %v", old, err)
					}
				}
				if _, err := repo.MigrateSteps(ctx); err != nil {
					t.Fatalf("MigrateSteps (SameTx %v): %v", sameTx, err)
				}
				if err := repo.Close(); err != nil {
					t.Fatal(err)
				}
			}
			want := int64(n)
			if tc.before != "" {
				want++ // pay_old
			}
			if count, err := (SQLiteRepo{Store: store}).Count(ctx); err != nil || count != want {
				t.Fatalf("%d payments, %v; want %d", count, err, want)
			}
		})
	}
}
