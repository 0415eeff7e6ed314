package pgstore

import (
	"context"

	"github.com/idemhq/idem/pgstore/internal/pgdb"
	"github.com/jackc/pgx/v5/pgxpool"
)

// NewWithoutAdvisoryLock is New with migrations that do not take the
// advisory lock, as on databases that lack it.
func NewWithoutAdvisoryLock(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	s, _, err := build(cfg)
	if err != nil {
		return nil, err
	}
	s.db, s.pool = pgdb.Pool{P: pool}, pool
	s.noAdvisoryLock = true
	if err := s.migrate(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Migrations is the number of embedded migrations: one history row each.
const Migrations = 6

// StuckStatements returns the statements of Stuck and of Stuck with Held,
// for the plan tests.
func (s *Store) StuckStatements() (stuck, held string) { return s.stuckSQL, s.heldSQL }

// PinClaimStatement makes Claim always start with the INSERT of a new key
// (insert true) or always with the statement that also answers
// duplicates, instead of choosing by what its recent claims met.
func PinClaimStatement(s *Store, insert bool) {
	s.dups.Pin("dups")
	if insert {
		s.dups.Pin("new")
	}
}

// ClaimsMostlyNew reports whether Claim would start with the INSERT of a
// new key.
func ClaimsMostlyNew(s *Store) bool { return s.dups.MostlyNew() }

// SQLState is sqlState: the SQLSTATE of a PostgreSQL error, or "".
var SQLState = sqlState
