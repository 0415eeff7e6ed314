package mysqlstore_test

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemhq/idem/mysqlstore"
)

// defaultMySQLURL is the DSN (go-sql-driver's form) of the MariaDB server
// the tests use unless IDEM_TEST_MYSQL_URL names another.
const defaultMySQLURL = "root@tcp(127.0.0.1:3306)/test"

// testPoolConns is the size of the pools the tests share. The server is
// shared with other test runs, so it stays small.
const testPoolConns = 16

var shared struct {
	sync.Mutex
	dbs map[bool]*sql.DB // by interpolateParams
}

func mysqlURL() string {
	if u := os.Getenv("IDEM_TEST_MYSQL_URL"); u != "" {
		return u
	}
	return defaultMySQLURL
}

// unreachable skips the test when the server cannot be reached on a
// developer's machine, and fails it in CI.
func unreachable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("MariaDB at %s is unreachable (CI is set): %v", mysqlURL(), err)
	}
	t.Skipf("MariaDB at %s is unreachable: %v", mysqlURL(), err)
}

// openDB opens a pool on the test server; interpolate sets the driver's
// interpolateParams (client-side placeholders, one round trip a statement)
// instead of server-side prepared statements.
func openDB(interpolate bool, conns int, tweak func(*mysql.Config)) (*sql.DB, error) {
	cfg, err := mysql.ParseDSN(mysqlURL())
	if err != nil {
		return nil, err
	}
	cfg.InterpolateParams = interpolate
	cfg.Timeout = 5 * time.Second
	if tweak != nil {
		tweak(cfg)
	}
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(c)
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

// sharedDB returns the pool of this package's tests, opened on first use.
func sharedDB(t testing.TB, interpolate bool) *sql.DB {
	t.Helper()
	shared.Lock()
	defer shared.Unlock()
	if db := shared.dbs[interpolate]; db != nil {
		return db
	}
	db, err := openDB(interpolate, testPoolConns, nil)
	if err != nil {
		unreachable(t, err)
	}
	if shared.dbs == nil {
		shared.dbs = map[bool]*sql.DB{}
	}
	shared.dbs[interpolate] = db
	return db
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, db := range shared.dbs {
		db.Close()
	}
	os.Exit(leaked(code))
}

// freshTable returns a table name no other test uses; the table and its
// migration history are dropped at cleanup.
func freshTable(t testing.TB, db *sql.DB) string {
	t.Helper()
	name := "idemtest_" + strings.ToLower(crand.Text()[:12])
	t.Cleanup(func() { dropTable(t, db, name) })
	return name
}

func dropTable(t testing.TB, db *sql.DB, name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+name+"`"); err != nil {
		t.Errorf("drop table %s: %v", name, err)
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM idem_migrations WHERE table_name = ?", name); err != nil {
		t.Errorf("drop the history of %s: %v", name, err)
	}
}

// fixture is a store on a fresh table.
type fixture struct {
	db    *sql.DB
	store *mysqlstore.Store
	table string // quoted
}

func newFixture(t testing.TB, cfg *mysqlstore.Config) *fixture {
	return newFixtureOn(t, sharedDB(t, false), cfg)
}

func newFixtureOn(t testing.TB, db *sql.DB, cfg *mysqlstore.Config) *fixture {
	t.Helper()
	var c mysqlstore.Config
	if cfg != nil {
		c = *cfg
	}
	c.Table = freshTable(t, db)
	store, err := mysqlstore.New(context.Background(), db, &c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &fixture{db: db, store: store, table: "`" + c.Table + "`"}
}

// exec runs a statement of the test's own (backdating, business tables).
func (f *fixture) exec(t testing.TB, q string, args ...any) int64 {
	t.Helper()
	res, err := f.db.ExecContext(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *fixture) count(t testing.TB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := f.db.QueryRowContext(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// expireLease moves the lease of (scope, key) into the past, as if it had
// run out: the store decides with the database clock.
func (f *fixture) expireLease(t testing.TB, scope, key string) {
	t.Helper()
	n := f.exec(t, "UPDATE "+f.table+" SET lease_expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE scope = ? AND `key` = ? AND token IS NOT NULL", scope, key)
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
