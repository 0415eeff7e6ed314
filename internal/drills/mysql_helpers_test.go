package drills_test

import (
	"context"
	"database/sql"
	"os"
	"testing"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/go-sql-driver/mysql"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/mysqlstore"
)

// mysqlConfig is the test MariaDB's DSN (IDEM_TEST_MYSQL_URL, in
// go-sql-driver's form).
func mysqlConfig(tb testing.TB) *mysql.Config {
	tb.Helper()
	dsn := os.Getenv("IDEM_TEST_MYSQL_URL")
	if dsn == "" {
		dsn = "root@tcp(127.0.0.1:3306)/test"
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		tb.Fatalf("IDEM_TEST_MYSQL_URL: %v", err)
	}
	cfg.InterpolateParams = true
	cfg.Timeout = 5 * time.Second
	return cfg
}

// newMyDB opens a pool with cfg, closed when tb ends.
func newMyDB(tb testing.TB, cfg *mysql.Config) *sql.DB {
	tb.Helper()
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		unreachable(tb, "MariaDB at "+cfg.Addr, err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// newMyStore returns a mysqlstore on a fresh table of db (table, or a
// random name if empty), dropped when tb ends.
func newMyStore(tb testing.TB, db *sql.DB, table string) *mysqlstore.Store {
	tb.Helper()
	if table == "" {
		table = newSchemaName()
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+table+"`"); err != nil {
			tb.Errorf("dropping table %s: %v", table, err)
		}
		if _, err := db.ExecContext(ctx, "DELETE FROM idem_migrations WHERE table_name = ?", table); err != nil {
			tb.Errorf("dropping the history of %s: %v", table, err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := mysqlstore.New(ctx, db, &mysqlstore.Config{Table: table})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// faultyMySQL returns a store on the test MariaDB through a toxiproxy,
// with read and write timeouts that end a stalled call within half a
// second. The table is created on a direct connection first.
func faultyMySQL(t *testing.T) (idemstore.Store, *toxiproxy.Proxy) {
	cfg := mysqlConfig(t)
	table := newSchemaName()
	newMyStore(t, newMyDB(t, cfg), table)
	p := newToxiproxy(t, cfg.Addr)
	through := cfg.Clone()
	through.Addr = p.Listen
	through.Timeout = 500 * time.Millisecond
	through.ReadTimeout, through.WriteTimeout = 500*time.Millisecond, 500*time.Millisecond
	db := newMyDB(t, through)
	s, err := mysqlstore.New(t.Context(), db, &mysqlstore.Config{Table: table, SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	return s, p
}
