package pgstore_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

const defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// testPoolConns is the size of the pool the tests share. The server is
// shared with other test runs, so it stays small.
const testPoolConns = 12

var shared struct {
	once sync.Once
	pool *pgxpool.Pool
	err  error

	sqlOnce sync.Once
	db      *sql.DB // a database/sql DB of its own, for NewDB
	sqlErr  error
}

// The two ways a program reaches PostgreSQL: New on a pgx pool, NewDB on
// a database/sql DB opened with pgx's stdlib driver.
const (
	modePgx = "pgx"
	modeSQL = "sql"
)

// eachMode runs f as a parallel subtest per mode.
func eachMode(t *testing.T, f func(t *testing.T, mode string)) {
	t.Helper()
	for _, m := range []string{modePgx, modeSQL} {
		t.Run(m, func(t *testing.T) {
			t.Parallel()
			f(t, m)
		})
	}
}

// openSQL opens a database/sql DB with pgx's stdlib driver, as GORM, sqlx,
// bun and ent open one, with as many idle connections as open ones.
func openSQL(conns int) (*sql.DB, error) {
	cfg, err := pgx.ParseConfig(postgresURL())
	if err != nil {
		return nil, err
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(conns)
	db.SetMaxIdleConns(conns)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

// sharedSQL returns the database/sql DB the tests of this package share.
func sharedSQL(t testing.TB) *sql.DB {
	t.Helper()
	shared.sqlOnce.Do(func() { shared.db, shared.sqlErr = openSQL(testPoolConns) })
	if shared.sqlErr != nil {
		unreachable(t, shared.sqlErr)
	}
	return shared.db
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
	// The package's tests mostly wait: leases and retention pass in real
	// time (the conformance suite's ServerClock), for a few seconds of
	// CPU. At go test's default parallelism (GOMAXPROCS, 2 on the CI
	// machine) they took 6 min 19 s; at 8, 1 min 45 s, for the same 18 s
	// of CPU. An explicit -parallel still decides.
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit && runtime.GOMAXPROCS(0) < 8 {
		_ = flag.Set("test.parallel", "8")
	}
	code := m.Run()
	if shared.pool != nil {
		shared.pool.Close()
	}
	if shared.db != nil {
		shared.db.Close()
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
		// DROP … CASCADE locks every object of the schema; a backend
		// still letting go of them (a connection a test cut mid
		// transaction) or autovacuum's BRIN summarising can make
		// PostgreSQL pick it as a deadlock victim. It is then retried.
		var err error
		for range 5 {
			if _, err = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); pgstore.SQLState(err) != "40P01" { // not deadlock_detected
				break
			}
		}
		if err != nil {
			t.Errorf("drop schema %s: %v", name, err)
		}
	})
	return name
}

// fixture is a store on a fresh schema. Its own statements (backdating,
// business tables, checks) run on pool in either mode.
type fixture struct {
	mode   string
	pool   *pgxpool.Pool
	db     *sql.DB // the store's *sql.DB in modeSQL, else nil
	store  *pgstore.Store
	schema string
	// table is the quoted, schema-qualified records table.
	table string
}

// newFixture is a fixture of a Store made by New.
func newFixture(t testing.TB, cfg *pgstore.Config) *fixture {
	t.Helper()
	return newFixtureIn(t, modePgx, cfg)
}

// newFixtureIn is a fixture of a Store made by New (modePgx) or NewDB
// (modeSQL).
func newFixtureIn(t testing.TB, mode string, cfg *pgstore.Config) *fixture {
	t.Helper()
	pool := sharedPool(t)
	f := &fixture{mode: mode, pool: pool, schema: freshSchema(t, pool)}
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
	var (
		store *pgstore.Store
		err   error
	)
	if mode == modeSQL {
		f.db = sharedSQL(t)
		store, err = pgstore.NewDB(context.Background(), f.db, &c)
	} else {
		store, err = pgstore.New(context.Background(), pool, &c)
	}
	if err != nil {
		t.Fatalf("New (%s): %v", mode, err)
	}
	f.store = store
	return f
}

// bizTx is a business transaction of the caller's, in the fixture's mode:
// a pgx.Tx or a *sql.Tx.
type bizTx struct {
	f   *fixture
	pgx pgx.Tx
	sql *sql.Tx
}

func (f *fixture) begin(t testing.TB) *bizTx {
	t.Helper()
	b := &bizTx{f: f}
	var err error
	if f.mode == modeSQL {
		b.sql, err = f.db.BeginTx(context.Background(), nil)
	} else {
		b.pgx, err = f.pool.Begin(context.Background())
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.rollback(context.Background()) })
	return b
}

func (b *bizTx) native() any {
	if b.sql != nil {
		return b.sql
	}
	return b.pgx
}

func (b *bizTx) exec(ctx context.Context, q string, args ...any) error {
	return nativeExec(ctx, b.native(), q, args...)
}

func (b *bizTx) queryRow(ctx context.Context, q string, args ...any) interface{ Scan(...any) error } {
	return nativeQueryRow(ctx, b.native(), q, args...)
}

// complete is CompleteTx or CompleteSQLTx.
func (b *bizTx) complete(ctx context.Context, p idemstore.CompleteParams) error {
	if b.sql != nil {
		return b.f.store.CompleteSQLTx(ctx, b.sql, p)
	}
	return b.f.store.CompleteTx(ctx, b.pgx, p)
}

func (b *bizTx) commit(ctx context.Context) error {
	if b.sql != nil {
		return b.sql.Commit()
	}
	return b.pgx.Commit(ctx)
}

// rollback does nothing after commit or rollback.
func (b *bizTx) rollback(ctx context.Context) error {
	if b.sql != nil {
		if err := b.sql.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
			return err
		}
		return nil
	}
	if err := b.pgx.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// nativeExec runs q in native, a pgx.Tx or a *sql.Tx (an idemstore.Tx's
// Native).
func nativeExec(ctx context.Context, native any, q string, args ...any) error {
	switch tx := native.(type) {
	case pgx.Tx:
		_, err := tx.Exec(ctx, q, args...)
		return err
	case *sql.Tx:
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	}
	return fmt.Errorf("native transaction of type %T", native)
}

func nativeQueryRow(ctx context.Context, native any, q string, args ...any) interface{ Scan(...any) error } {
	if tx, ok := native.(*sql.Tx); ok {
		return tx.QueryRowContext(ctx, q, args...)
	}
	return native.(pgx.Tx).QueryRow(ctx, q, args...)
}

// execTx runs q in the transaction of the execution ctx belongs to, as a
// handler does: through pgstore.Tx or pgstore.SQLTx, whichever the
// store's mode gives.
func execTx(ctx context.Context, q string, args ...any) error {
	if tx, err := pgstore.Tx(ctx); err == nil {
		_, err = tx.Exec(ctx, q, args...)
		return err
	}
	tx, err := pgstore.SQLTx(ctx)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, q, args...)
	return err
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
