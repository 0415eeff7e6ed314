package sqlitestore

import (
	"context"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/internal/dupscore"
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
// run of duplicates.
func (s *Store) PreferReads() {
	for range dupscore.Max {
		s.mix.Record(true)
	}
}

// ReadsFirst reports whether ClaimTx reads before it takes the write lock.
func (s *Store) ReadsFirst() bool { return !s.mix.MostlyNew() }
