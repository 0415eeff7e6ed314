package datalayer

import (
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParse(t *testing.T) {
	for _, c := range []struct{ in, backend, dsn string }{
		{"orders.db", "sqlite", "orders.db"},
		{"sqlite:/tmp/o.db", "sqlite", "/tmp/o.db"},
		{"postgres://u@h:5432/d?search_path=s", "postgres", "postgres://u@h:5432/d?search_path=s"},
		{"mysql://root@127.0.0.1:3306/test", "mysql", "root@tcp(127.0.0.1:3306)/test"},
		{"mysql://app:p%40ss@db:3306/shop", "mysql", "app:p@ss@tcp(db:3306)/shop"},
	} {
		b, dsn, err := Parse(c.in)
		if err != nil || b.Name != c.backend || dsn != c.dsn {
			t.Errorf("Parse(%q) = %v, %q, %v; want %s, %q", c.in, b, dsn, err, c.backend, c.dsn)
		}
	}
	for _, bad := range []string{"redis://h:6379", "mysql://h:3306/db", "mysql://u@h:3306/"} {
		if _, _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

// Parse never panics, and a mysql:// value it accepts gives a DSN the
// driver parses, with the same database.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"orders.db", "mysql://root@127.0.0.1:3306/test", "mysql://a:b@h/d?x=1", "postgres://h/d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, dsn, err := Parse(s)
		if err != nil || b != MySQL {
			return
		}
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatalf("Parse(%q) = %q, which the driver refuses: %v", s, dsn, err)
		}
		if cfg.DBName == "" || strings.ContainsAny(cfg.DBName, "/") {
			t.Fatalf("Parse(%q): database %q", s, cfg.DBName)
		}
	})
}
