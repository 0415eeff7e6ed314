package payments

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
)

// foreignTables are payments tables the demo cannot use, with what the
// refusal must name. The first two are the README's transactional
// snippets' tables (PostgreSQL's "payments (reference text, amount_cents
// bigint)", SQLite's with an INTEGER id).
var foreignTables = []struct {
	name, pg, sqlite string
	want             []string
}{
	{"readme snippet", `CREATE TABLE payments (reference text, amount_cents bigint)`,
		`CREATE TABLE payments (id INTEGER PRIMARY KEY, reference TEXT NOT NULL, amount_cents INTEGER NOT NULL)`,
		[]string{"no column", "tenant", "idempotency_key", "created_at"}},
	{"wrong type", `CREATE TABLE payments (id text PRIMARY KEY, tenant text NOT NULL, idempotency_key text NOT NULL,
		amount_cents text NOT NULL, currency text NOT NULL, reference text NOT NULL, created_at timestamptz NOT NULL,
		UNIQUE (tenant, idempotency_key))`,
		`CREATE TABLE payments (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, idempotency_key TEXT NOT NULL,
		amount_cents TEXT NOT NULL, currency TEXT NOT NULL, reference TEXT NOT NULL, created_at TEXT NOT NULL,
		UNIQUE (tenant, idempotency_key))`,
		[]string{"column amount_cents is text"}},
	{"required extra column", `CREATE TABLE payments (id text PRIMARY KEY, tenant text NOT NULL, idempotency_key text NOT NULL,
		amount_cents bigint NOT NULL, currency text NOT NULL, reference text NOT NULL, created_at timestamptz NOT NULL,
		customer text NOT NULL, UNIQUE (tenant, idempotency_key))`,
		`CREATE TABLE payments (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, idempotency_key TEXT NOT NULL,
		amount_cents INTEGER NOT NULL, currency TEXT NOT NULL, reference TEXT NOT NULL, created_at TEXT NOT NULL,
		customer TEXT NOT NULL, UNIQUE (tenant, idempotency_key))`,
		[]string{"column customer is NOT NULL without a default"}},
	{"wrong provider column", `CREATE TABLE payments (id text PRIMARY KEY, tenant text NOT NULL, idempotency_key text NOT NULL,
		amount_cents bigint NOT NULL, currency text NOT NULL, reference text NOT NULL, created_at timestamptz NOT NULL,
		status integer, UNIQUE (tenant, idempotency_key))`,
		`CREATE TABLE payments (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, idempotency_key TEXT NOT NULL,
		amount_cents INTEGER NOT NULL, currency TEXT NOT NULL, reference TEXT NOT NULL, created_at TEXT NOT NULL,
		status INTEGER, UNIQUE (tenant, idempotency_key))`,
		[]string{"column status is integer, not text"}},
	{"a view", `CREATE VIEW payments AS SELECT 1 AS id`, `CREATE VIEW payments AS SELECT 1 AS id`,
		[]string{"not a table"}},
}

// checkSchemaError fails the test unless err is a *SchemaError naming
// table, each of want, and what to do.
func checkSchemaError(t *testing.T, err error, table string, want []string) {
	t.Helper()
	var se *SchemaError
	if !errors.As(err, &se) {
		t.Fatalf("Migrate: %v, want a *SchemaError", err)
	}
	msg := err.Error()
	for _, w := range append([]string{"table " + table + " ", "--db", "rename"}, want...) {
		if !strings.Contains(msg, w) {
			t.Errorf("the refusal does not say %q: %s", w, msg)
		}
	}
}

// A payments table of another shape is refused at Migrate with a message
// naming the table, what is wrong and what to do, instead of every payment
// answering 503 later (PostgreSQL).
func TestPostgresMigrateRefusesForeignTable(t *testing.T) {
	t.Parallel()
	for _, tc := range foreignTables {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool, schema := pgSchema(t)
			ctx := context.Background()
			if _, err := pool.Exec(ctx, tc.pg); err != nil {
				t.Fatal(err)
			}
			repo := PostgresRepo{Pool: pool}
			checkSchemaError(t, repo.Migrate(ctx), schema+".payments", tc.want)
			// The provider mode's migration refuses it too, and adds
			// nothing to it.
			if _, err := repo.MigrateSteps(ctx); err == nil {
				t.Error("MigrateSteps accepted the table")
			}
		})
	}
}

// The same on SQLite.
func TestSQLiteMigrateRefusesForeignTable(t *testing.T) {
	t.Parallel()
	for _, tc := range foreignTables {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store := openSQLite(t)
			if _, err := store.DB().ExecContext(ctx, tc.sqlite); err != nil {
				t.Fatal(err)
			}
			repo := SQLiteRepo{Store: store}
			checkSchemaError(t, repo.Migrate(ctx), "payments", tc.want)
			if _, err := repo.MigrateSteps(ctx); err == nil {
				t.Error("MigrateSteps accepted the table")
			}
		})
	}
}

// The demo's own table passes the check, with and without the provider
// columns, and a table that already has them is migrated again without a
// change (restarts, a second instance).
func TestMigrateAcceptsOwnTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pool, _ := pgSchema(t)
		repo := PostgresRepo{Pool: pool}
		for range 2 {
			if err := repo.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := repo.MigrateSteps(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		store := openSQLite(t)
		repo := SQLiteRepo{Store: store}
		for range 2 {
			if err := repo.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := repo.MigrateSteps(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// Instances that start together on a fresh database migrate one after the
// other: concurrent Migrate and MigrateSteps calls, each on its own
// connection, all succeed and agree on the secret. (Without the advisory
// lock, concurrent CREATE TABLE IF NOT EXISTS fail with a duplicate key
// in pg_type.)
func TestPostgresMigrateConcurrent(t *testing.T) {
	t.Parallel()
	const instances = 4
	for round := range 5 {
		pool, _ := pgSchema(t)
		ctx := context.Background()
		var wg sync.WaitGroup
		errs := make([]error, instances)
		secrets := make([][]byte, instances)
		start := make(chan struct{})
		for i := range instances {
			wg.Go(func() {
				<-start
				repo := PostgresRepo{Pool: pool}
				if errs[i] = repo.Migrate(ctx); errs[i] == nil {
					secrets[i], errs[i] = repo.MigrateSteps(ctx)
				}
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, instance %d: %v", round, i, err)
			}
			if string(secrets[i]) != string(secrets[0]) {
				t.Fatalf("round %d: instances got different secrets", round)
			}
		}
	}
}
