package payments

import (
	"fmt"
	"slices"
	"strings"
)

// column is a column of the payments table as the demo writes and reads
// it, with its type on each database: PostgreSQL's format_type, SQLite's
// type affinity (https://sqlite.org/datatype3.html#determination_of_column_affinity),
// MariaDB's information_schema DATA_TYPE.
type column struct {
	name, pg, sqlite, mysql string
}

// baseColumns are the columns every payment has (createTable).
var baseColumns = []column{
	{"id", "text", "TEXT", "varchar"},
	{"tenant", "text", "TEXT", "varchar"},
	{"idempotency_key", "text", "TEXT", "varchar"},
	{"amount_cents", "bigint", "INTEGER", "bigint"},
	{"currency", "text", "TEXT", "varchar"},
	{"reference", "text", "TEXT", "text"},
	{"created_at", "timestamp with time zone", "TEXT", "datetime"},
}

// stepColumns are the provider columns MigrateSteps adds.
var stepColumns = []column{
	{"status", "text", "TEXT", "varchar"},
	{"charge_id", "text", "TEXT", "varchar"},
	{"provider_key", "text", "TEXT", "varchar"},
	{"failure_code", "text", "TEXT", "varchar"},
	{"failure_reason", "text", "TEXT", "text"},
}

// tableColumn is a column the database reports for the existing table.
type tableColumn struct {
	name, typ string
	// required: NOT NULL without a default, so that an insert that does
	// not name it fails.
	required bool
}

// SchemaError is returned by Migrate (and MigrateSteps) when the database
// already has a table named payments that the demo cannot use: another
// application's, such as the one the README's transactional snippet
// creates. Without this check every payment would fail (503) or be
// refused (422) at run time instead of the service refusing to start.
type SchemaError struct {
	// Table names the table, schema-qualified on PostgreSQL.
	Table string
	// Problems says how it differs from the demo's table, one item each.
	Problems []string
	// Fix says what the operator can do.
	Fix string
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("payments: the database already has a table %s that is not the payments table of idem serve (%s); %s",
		e.Table, strings.Join(e.Problems, "; "), e.Fix)
}

// shapeProblems lists how the columns got differ from what the demo needs:
// every column of want with its type, the type of any column of optional
// that exists, and no other column that an insert must set. typ picks the
// type a column has on the database at hand.
func shapeProblems(got []tableColumn, want, optional []column, typ func(column) string) []string {
	var problems, missing []string
	known := map[string]bool{}
	check := func(c column, mustExist bool) {
		known[c.name] = true
		i := slices.IndexFunc(got, func(g tableColumn) bool { return g.name == c.name })
		switch {
		case i < 0 && mustExist:
			missing = append(missing, c.name)
		case i >= 0 && got[i].typ != typ(c):
			problems = append(problems, fmt.Sprintf("column %s is %s, not %s", c.name, strings.ToLower(got[i].typ), strings.ToLower(typ(c))))
		}
	}
	for _, c := range want {
		check(c, true)
	}
	for _, c := range optional {
		check(c, false)
	}
	if len(missing) > 0 {
		problems = append([]string{"it has no column " + strings.Join(missing, ", ")}, problems...)
	}
	for _, g := range got {
		if !known[g.name] && g.required {
			problems = append(problems, fmt.Sprintf("column %s is NOT NULL without a default, and the demo's inserts do not set it", g.name))
		}
	}
	return problems
}

// sqliteAffinity returns the type affinity SQLite gives a column declared
// with type decl.
func sqliteAffinity(decl string) string {
	d := strings.ToUpper(decl)
	switch {
	case strings.Contains(d, "INT"):
		return "INTEGER"
	case strings.Contains(d, "CHAR"), strings.Contains(d, "CLOB"), strings.Contains(d, "TEXT"):
		return "TEXT"
	case d == "", strings.Contains(d, "BLOB"):
		return "BLOB"
	case strings.Contains(d, "REAL"), strings.Contains(d, "FLOA"), strings.Contains(d, "DOUB"):
		return "REAL"
	}
	return "NUMERIC"
}
