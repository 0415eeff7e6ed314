package mysqlstore_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	"github.com/idemhq/idem/idemstore"
)

// Stuck and Held read the index of stuck_lease (migration 2), which holds
// the records with a recovery point only: on a table of many completed
// records and a few in flight, the plan is that index's range and the
// answers are exactly the suspended and the held records.
func TestStuckReadsTheStuckLeaseIndex(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := context.Background()
	f.exec(t, `INSERT INTO `+f.table+" (scope, `key`, fingerprint, expires_at, response) "+
		`SELECT 's', CONCAT('done', seq), 'f', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, 'x' FROM seq_1_to_20000`)
	for _, r := range []struct{ prefix, lease, checkpoint, n string }{
		{"live", "UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE", "NULL", "30"},
		{"abandoned", "UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE", "NULL", "20"},
		{"suspended", "UTC_TIMESTAMP(6) - INTERVAL 1 MINUTE", "'cp'", "10"},
		{"held", "'1970-01-01 00:00:00'", "'cp'", "5"},
	} {
		f.exec(t, `INSERT INTO `+f.table+" (scope, `key`, fingerprint, token, lease_expires_at, expires_at, checkpoint) "+
			`SELECT 's', CONCAT(?, seq), 'f', CONCAT('t', seq), `+r.lease+`, UTC_TIMESTAMP(6) + INTERVAL 1 HOUR, `+r.checkpoint+
			` FROM seq_1_to_`+r.n, r.prefix)
	}
	f.exec(t, "ANALYZE TABLE "+f.table)
	stuck, held := f.store.StuckStatements()
	want := strings.Trim(f.table, "`") + "_stuck_lease"
	for name, q := range map[string]string{"stuck": stuck, "held": held} {
		rows, err := f.db.QueryContext(ctx, "EXPLAIN "+strings.ReplaceAll(q, "?", "100"))
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]sql.NullString, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			plan := map[string]string{}
			for i, c := range cols {
				plan[c] = vals[i].String
			}
			if plan["key"] != want || plan["type"] == "ALL" {
				t.Errorf("%s: plan %v, want a read of %s", name, plan, want)
			}
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		rows.Close()
	}
	for held, n := range map[bool]int{false: 10, true: 5} {
		got, err := f.store.Stuck(ctx, idemstore.StuckParams{Limit: 100, Held: held})
		if err != nil || len(got) != n {
			t.Errorf("Stuck(Held: %v) = %d records, %v; want %d", held, len(got), err, n)
		}
	}
}
