package sqlitestore_test

import (
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
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
	after := idem.ListCursor("s3", "k100")
	for _, c := range []struct {
		name string
		p    idem.ListParams
		want string
	}{
		{"first page", idem.ListParams{}, "SCAN idem_records"},
		{"next page", idem.ListParams{After: after}, "USING PRIMARY KEY ((scope,key)>(?,?))"},
		{"state", idem.ListParams{State: idem.StateInFlight}, "SCAN idem_records"},
		{"state, next page", idem.ListParams{State: idem.StateCompleted, After: after}, "USING PRIMARY KEY ((scope,key)>(?,?))"},
		{"key", idem.ListParams{Key: "k5"}, "SCAN idem_records"},
		{"key, next page", idem.ListParams{Key: "k5", After: after}, "USING PRIMARY KEY ((scope,key)>(?,?))"},
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
