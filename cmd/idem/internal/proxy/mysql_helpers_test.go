package proxy

import (
	"context"
	"crypto/rand"
	"database/sql"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// mysqlSpec returns a store spec (mysql://) on a fresh records table in
// the MariaDB database of IDEM_TEST_MYSQL_URL (a go-sql-driver DSN), and
// drops the table when the test ends.
func mysqlSpec(t testing.TB) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(envOr("IDEM_TEST_MYSQL_URL", "root@tcp(127.0.0.1:3306)/test"))
	if err != nil {
		t.Fatalf("IDEM_TEST_MYSQL_URL: %v", err)
	}
	cfg.Timeout = 5 * time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	requireServer(t, "MariaDB", db.PingContext(ctx))
	table := "proxytest_" + strings.ToLower(rand.Text()[:12])
	t.Cleanup(func() {
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+table+"`"); err != nil {
			t.Errorf("drop table %s: %v", table, err)
		}
		if _, err := db.ExecContext(ctx, "DELETE FROM idem_migrations WHERE table_name = ?", table); err != nil {
			t.Errorf("drop the history of %s: %v", table, err)
		}
	})
	u := url.URL{Scheme: "mysql", User: url.UserPassword(cfg.User, cfg.Passwd), Host: cfg.Addr, Path: "/" + cfg.DBName,
		RawQuery: "idem_table=" + table}
	if cfg.Passwd == "" {
		u.User = url.User(cfg.User)
	}
	return u.String()
}
