package mysqlstore

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The embedded, versioned migrations. A file's name starts with its
// version number; see the comment at the top of the first one for the rules
// every migration follows.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationsTable records, per records table, which versions have been
// applied, in the connection's database.
const migrationsTable = "idem_migrations"

// migrateLockWait bounds the wait for another instance's migration when ctx
// has no deadline of its own.
const migrateLockWait = 60 * time.Second

type migration struct {
	version    int
	statements []string
}

// loadMigrations returns the embedded migrations in version order, with
// their placeholders replaced.
func loadMigrations(r *strings.Replacer) ([]migration, error) {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, name := range names {
		base := path.Base(name)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration file %s: no version prefix", base)
		}
		text, err := migrationFiles.ReadFile(name)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, statements: splitStatements(r.Replace(string(text)))})
	}
	slices.SortFunc(ms, func(a, b migration) int { return a.version - b.version })
	for i := 1; i < len(ms); i++ {
		if ms[i].version == ms[i-1].version {
			return nil, fmt.Errorf("two migrations with version %d", ms[i].version)
		}
	}
	return ms, nil
}

// splitStatements splits a migration file into statements, dropping comment
// lines. Statements end with a semicolon at the end of a line.
func splitStatements(text string) []string {
	var out []string
	var cur strings.Builder
	for line := range strings.Lines(text) {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		if strings.HasSuffix(trimmed, ";") {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}

// migrate brings the table to the latest version. MariaDB commits every DDL
// statement on its own, so a transaction cannot serialise migrations:
// GET_LOCK, a named lock held by one connection, does. Every statement is
// idempotent as well, so that a migration interrupted half-way (a crash
// between two DDL statements) completes on the next start.
func (s *Store) migrate(ctx context.Context) error {
	if v, err := s.appliedVersion(ctx, s.db); err == nil && v >= s.latest {
		// The common case at start-up: nothing to do, no lock taken.
		return nil
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	wait := migrateLockWait
	if d, ok := ctx.Deadline(); ok {
		wait = time.Until(d)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+lockName+", ?)", s.tableName, math.Max(wait.Seconds(), 0)).Scan(&got); err != nil {
		return fmt.Errorf("take the migration lock: %w", err)
	}
	if !got.Valid || got.Int64 != 1 {
		return fmt.Errorf("another instance held the migration lock of %s for %v", s.table, wait.Round(time.Millisecond))
	}
	defer func() {
		// Closing the connection releases the lock too; this returns it
		// before the connection goes back to the pool.
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK("+lockName+")", s.tableName)
	}()
	if _, err := conn.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+quote(migrationsTable)+` (
		table_name VARBINARY(64) NOT NULL,
		version    INT           NOT NULL,
		applied_at DATETIME(6)   NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
		PRIMARY KEY (table_name, version)) ENGINE = InnoDB`); err != nil {
		return err
	}
	applied, err := s.appliedVersions(ctx, conn)
	if err != nil {
		return err
	}
	for _, m := range s.migrationList {
		if slices.Contains(applied, m.version) {
			continue
		}
		for _, stmt := range m.statements {
			if _, err := conn.ExecContext(ctx, stmt); err != nil {
				return fmt.Errorf("version %d: %w", m.version, err)
			}
		}
		if _, err := conn.ExecContext(ctx, "INSERT INTO "+quote(migrationsTable)+" (table_name, version) VALUES (?, ?)", s.tableName, m.version); err != nil {
			return fmt.Errorf("version %d: %w", m.version, err)
		}
	}
	return nil
}

// appliedVersion returns the highest applied version of the store's table.
// It fails if the history table does not exist yet.
func (s *Store) appliedVersion(ctx context.Context, db queryer) (int, error) {
	var v int
	err := db.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM "+quote(migrationsTable)+" WHERE table_name = ?", s.tableName).Scan(&v)
	return v, err
}

func (s *Store) appliedVersions(ctx context.Context, conn *sql.Conn) ([]int, error) {
	rows, err := conn.QueryContext(ctx, "SELECT version FROM "+quote(migrationsTable)+" WHERE table_name = ?", s.tableName)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// lockName is the GET_LOCK name that serialises migrations of one table
// (the placeholder) in the connection's database: lock names are
// server-wide and at most 64 characters.
const lockName = "CONCAT('idem_migrate:', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', ?)))"
