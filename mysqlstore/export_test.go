package mysqlstore

// Migrations is the number of embedded migrations: one history row each.
const Migrations = 2

// StuckStatements returns the statements of Stuck and of Stuck with Held,
// for the plan test.
func (s *Store) StuckStatements() (stuck, held string) { return s.sql.stuck, s.sql.held }

// PinReadFirst makes a ReadFirst store always read first, instead of
// choosing by what its recent claims met.
func PinReadFirst(s *Store) { s.dups.Pin("dups") }

// ReadsFirst reports whether a ReadFirst store's next claim would read
// before it inserts.
func ReadsFirst(s *Store) bool { return s.readFirst && !s.dups.MostlyNew() }
