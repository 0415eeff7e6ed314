package sqlitestore

import (
	"context"

	"github.com/idemhq/idem/idemstore"
)

// ListPlan returns SQLite's query plan for the statement List runs for p.
func (s *Store) ListPlan(ctx context.Context, p idemstore.ListParams) ([]string, error) {
	q, args, err := s.listQuery(p)
	if err != nil {
		return nil, err
	}
	rows, err := s.reader.QueryContext(ctx, "EXPLAIN QUERY PLAN "+q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			return nil, err
		}
		plan = append(plan, detail)
	}
	return plan, rows.Err()
}

// PreferReads makes the store's next ClaimTx calls read first, as after a
// run of duplicates (claimMix).
func (s *Store) PreferReads() { s.mix.score.Store(claimMixMax) }

// ReadsFirst reports whether ClaimTx reads before it takes the write lock.
func (s *Store) ReadsFirst() bool { return !s.mix.mostlyNew() }
