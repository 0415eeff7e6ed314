package mysqlstore

// Migrations is the number of embedded migrations: one history row each.
const Migrations = 2

// StuckStatements returns the statements of Stuck and of Stuck with Held,
// for the plan test.
func (s *Store) StuckStatements() (stuck, held string) { return s.sql.stuck, s.sql.held }
