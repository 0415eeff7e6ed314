package pgstore

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/idemhq/idem/pgstore/internal/pgdb"
)

// The embedded, versioned migrations. A file's name starts with its
// version number; see the comment at the top of the first one for the rules
// every migration follows.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationsTable records, per records table, which versions have been
// applied. It lives in the store's schema, so that a schema carries its own
// history.
const migrationsTable = "idem_migrations"

// migrateAttempts bounds the retries of a migration that lost a race with a
// concurrent one (only possible where advisory locks are unavailable).
const migrateAttempts = 8

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

// errLockUnavailable marks a failure of the advisory lock call itself.
var errLockUnavailable = errors.New("advisory lock unavailable")

// migrate brings the schema to the latest version. It is safe to run from
// many instances at once: on PostgreSQL a transaction-scoped advisory lock
// serialises them, and every statement is idempotent, so that on databases
// without working advisory locks (CockroachDB makes them no-ops or lacks
// them, older YugabyteDB lacks them) a migration that loses a race fails
// with a duplicate-object or serialization error, is retried, and converges.
func (s *Store) migrate(ctx context.Context) error {
	if v, err := s.appliedVersion(ctx); err == nil && v >= s.latest {
		// The common case at start-up: nothing to do, no lock taken.
		return nil
	}
	useLock := !s.noAdvisoryLock
	for attempt := 1; ; attempt++ {
		err := s.migrateOnce(ctx, useLock)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return err
		}
		code := sqlState(err)
		if useLock && errors.Is(err, errLockUnavailable) && (code == "42883" || code == "0A000") {
			// undefined_function or feature_not_supported: fall back to
			// idempotent DDL plus retries.
			useLock = false
			continue
		}
		switch code {
		case "23505", "42P06", "42P07", "42710", "40001", "40P01":
			// unique_violation (on the catalogues, or on the version row),
			// duplicate_schema, duplicate_table, duplicate_object,
			// serialization_failure, deadlock_detected: a concurrent
			// migration got there first. The next attempt sees its work.
			if attempt < migrateAttempts {
				continue
			}
		}
		return err
	}
}

// appliedVersion returns the highest applied version of the store's table.
// It fails if the schema or the version table does not exist yet.
func (s *Store) appliedVersion(ctx context.Context) (int, error) {
	var v int
	err := s.db.QueryRow(ctx,
		"SELECT coalesce(max(version), 0) FROM "+s.migrations+" WHERE table_name = $1", s.tableName).Scan(&v)
	return v, err
}

func (s *Store) migrateOnce(ctx context.Context, useLock bool) (err error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			// The error that made us roll back is the one to report.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if useLock {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", s.lockKey()); err != nil {
			return fmt.Errorf("%w: %w", errLockUnavailable, err)
		}
	}
	// CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege on the
	// database even when the schema exists, so it only runs when the
	// schema is missing: an operator may create the schema for a user
	// without that privilege.
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)", s.schemaName).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+s.schema); err != nil {
			return err
		}
	}
	if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+s.migrations+` (
		table_name text        NOT NULL,
		version    integer     NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now(),
		PRIMARY KEY (table_name, version))`); err != nil {
		return err
	}
	applied, err := appliedVersions(ctx, tx, s.migrations, s.tableName)
	if err != nil {
		return err
	}
	for _, m := range s.migrationList {
		if slices.Contains(applied, int32(m.version)) {
			continue
		}
		for _, stmt := range m.statements {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("version %d: %w", m.version, err)
			}
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+s.migrations+" (table_name, version) VALUES ($1, $2)", s.tableName, m.version); err != nil {
			return fmt.Errorf("version %d: %w", m.version, err)
		}
	}
	return tx.Commit(ctx)
}

// appliedVersions returns the versions applied to table.
func appliedVersions(ctx context.Context, tx pgdb.Querier, migrations, table string) ([]int32, error) {
	rows, err := tx.Query(ctx, "SELECT version FROM "+migrations+" WHERE table_name = $1", table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []int32
	for rows.Next() {
		var v int32
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// lockKey is the advisory lock that serialises migrations of one schema.
// It is derived from the schema name, so that stores in different schemas
// migrate independently.
func (s *Store) lockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("github.com/idemhq/idem/pgstore\x00"))
	h.Write([]byte(s.schemaName))
	return int64(h.Sum64())
}
