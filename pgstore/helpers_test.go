package pgstore_test

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// testPoolConns is the size of the pool the tests share. The server is
// shared with other test runs, so it stays small.
const testPoolConns = 12

var shared struct {
	once sync.Once
	pool *pgxpool.Pool
	err  error
}

func postgresURL() string {
	if u := os.Getenv("IDEM_TEST_POSTGRES_URL"); u != "" {
		return u
	}
	return defaultPostgresURL
}

// unreachable skips the test when the server cannot be reached on a
// developer's machine, and fails it in CI.
func unreachable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("PostgreSQL at %s is unreachable (CI is set): %v", postgresURL(), err)
	}
	t.Skipf("PostgreSQL at %s is unreachable: %v", postgresURL(), err)
}

// newPool opens a pool of at most conns connections, closed at cleanup.
func newPool(t testing.TB, conns int32) *pgxpool.Pool {
	t.Helper()
	pool, err := openPool(conns)
	if err != nil {
		unreachable(t, err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func openPool(conns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(postgresURL())
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = conns
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// sharedPool returns the pool the tests of this package share.
func sharedPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	shared.once.Do(func() { shared.pool, shared.err = openPool(testPoolConns) })
	if shared.err != nil {
		unreachable(t, shared.err)
	}
	return shared.pool
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.pool != nil {
		shared.pool.Close()
	}
	os.Exit(leaked(code))
}

// freshSchema returns the name of a schema that no other test uses; it is
// dropped at cleanup (New creates it).
func freshSchema(t testing.TB, pool *pgxpool.Pool) string {
	t.Helper()
	name := "idemtest_" + strings.ToLower(crand.Text()[:12])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// fixture is a store on a fresh schema.
type fixture struct {
	pool   *pgxpool.Pool
	store  *pgstore.Store
	schema string
	// table is the quoted, schema-qualified records table.
	table string
}

func newFixture(t testing.TB, cfg *pgstore.Config) *fixture {
	t.Helper()
	pool := sharedPool(t)
	f := &fixture{pool: pool, schema: freshSchema(t, pool)}
	var c pgstore.Config
	if cfg != nil {
		c = *cfg
	}
	c.Schema = f.schema
	table := c.Table
	if table == "" {
		table = pgstore.DefaultTable
	}
	f.table = pgx.Identifier{f.schema, table}.Sanitize()
	store, err := pgstore.New(context.Background(), pool, &c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	f.store = store
	return f
}

// exec runs a statement of the test's own (backdating, business tables).
func (f *fixture) exec(t testing.TB, sql string, args ...any) int64 {
	t.Helper()
	tag, err := f.pool.Exec(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return tag.RowsAffected()
}

func (f *fixture) count(t testing.TB, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// expireLease moves the lease of (scope, key) into the past, as if it had
// run out: the store decides with the database clock, so this is how a test
// lets a lease pass without waiting.
func (f *fixture) expireLease(t testing.TB, scope, key string) {
	t.Helper()
	n := f.exec(t, "UPDATE "+f.table+" SET lease_expires_at = now() - interval '1 second' WHERE scope = $1 AND key = $2 AND token IS NOT NULL", scope, key)
	if n != 1 {
		t.Fatalf("expireLease(%q, %q) updated %d rows", scope, key, n)
	}
}

var tokenSeq struct {
	sync.Mutex
	n int
}

func newToken() string {
	tokenSeq.Lock()
	defer tokenSeq.Unlock()
	tokenSeq.n++
	return fmt.Sprintf("tok-%d-%s", tokenSeq.n, crand.Text()[:6])
}
