package sqlitestore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
)

// A page of List reads the primary key from its cursor on: SQLite never
// sorts the table (a temporary B-tree) to answer one, whatever the
// filters, even when the statistics make the expiry index look selective.
func TestListUsesThePrimaryKey(t *testing.T) {
	t.Parallel()
	s, _ := open(t)
	ctx := t.Context()
	// Statistics of a table whose records are mostly expired: an expiry
	// bound then looks selective enough to read through its index.
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	_, err := s.DB().ExecContext(ctx, `WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i+1 FROM n WHERE i < 4999)
INSERT INTO idem_records (scope, key, fingerprint, state, lease_until, expires_at)
SELECT 's' || (i % 7), 'k' || i, 'v1:x', 1 + i % 2, 0, CASE WHEN i % 100 = 0 THEN ? ELSE ? END FROM n`,
		now.Add(time.Hour).UnixNano(), now.Add(-time.Hour).UnixNano())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.DB().ExecContext(ctx, `ANALYZE`); err != nil {
		t.Fatal(err)
	}
	after := idemstore.ListCursor("s3", "k100")
	for _, c := range []struct {
		name string
		p    idemstore.ListParams
		want string
	}{
		{"first page", idemstore.ListParams{}, "SCAN idem_records"},
		{"next page", idemstore.ListParams{After: after}, "USING PRIMARY KEY ((scope,key)>(?,?))"},
		{"state", idemstore.ListParams{State: idemstore.StateInFlight}, "SCAN idem_records"},
		{"state, next page", idemstore.ListParams{State: idemstore.StateCompleted, After: after}, "USING PRIMARY KEY ((scope,key)>(?,?))"},
		{"key", idemstore.ListParams{Key: "k5"}, "SCAN idem_records"},
		{"key, next page", idemstore.ListParams{Key: "k5", After: after}, "USING PRIMARY KEY ((scope,key)>(?,?))"},
	} {
		c.p.Limit, c.p.Now = 100, now
		plan, err := s.ListPlan(ctx, c.p)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		text := strings.Join(plan, "; ")
		if strings.Contains(text, "TEMP B-TREE") || !strings.Contains(text, c.want) {
			t.Errorf("%s: plan %q, want %q and no temporary B-tree", c.name, text, c.want)
		}
	}
}
