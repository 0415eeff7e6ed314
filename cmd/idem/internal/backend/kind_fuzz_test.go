package backend

import (
	"net"
	"net/url"
	"strings"
	"testing"
)

// FuzzKindOf feeds arbitrary --store values to the parser: it never
// panics; a value is either an error or one kind; a URL kind's scheme is
// one of the supported ones in any case, and normalise makes it lower case
// without touching the rest.
func FuzzKindOf(f *testing.F) {
	for _, s := range []string{"idem.db", "memory", "MEMORY", "postgres://u@h/db", "REDIS://h:6379/0",
		"rediss://h", "localhost:6379", "[::1]:5432", "mysql://x", "mysql://root@127.0.0.1:3306/test", "MySQL://u:p@h/db?idem_table=t", `C:\x.db`, "./a:b", "", ":", "a:", "ab:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		k, err := KindOf(spec)
		if err != nil {
			if k != "" {
				t.Fatalf("KindOf(%q) = %q with error %v", spec, k, err)
			}
			return
		}
		n := normalise(spec)
		if len(n) != len(spec) || !strings.EqualFold(n, spec) {
			t.Fatalf("normalise(%q) = %q", spec, n)
		}
		switch k {
		case Postgres:
			if !strings.HasPrefix(n, "postgres:") && !strings.HasPrefix(n, "postgresql:") {
				t.Fatalf("KindOf(%q) = postgres", spec)
			}
		case Redis:
			if !strings.HasPrefix(n, "redis:") && !strings.HasPrefix(n, "rediss:") {
				t.Fatalf("KindOf(%q) = redis", spec)
			}
		case SQLite:
			if _, ok := schemeOf(spec); ok || hostPort.MatchString(spec) || spec == "" {
				t.Fatalf("KindOf(%q) = sqlite for a URL or an address", spec)
			}
		case MySQL:
			if !strings.HasPrefix(n, "mysql:") && !strings.HasPrefix(n, "mariadb:") {
				t.Fatalf("KindOf(%q) = mysql", spec)
			}
		case Memory:
			if !strings.EqualFold(spec, "memory") {
				t.Fatalf("KindOf(%q) = memory", spec)
			}
		default:
			t.Fatalf("KindOf(%q) = %q", spec, k)
		}
	})
}

// FuzzParseMySQLURL: the MariaDB URL parser never panics; what it accepts
// names a user, a TCP address with a port and one database, and its
// error messages never show a password.
func FuzzParseMySQLURL(f *testing.F) {
	for _, s := range []string{"mysql://root@127.0.0.1:3306/test", "mysql://u:secret@h/db?idem_table=t&tls=false",
		"mariadb://u@[::1]:3307/db", "mysql://u@h/", "mysql://h/db", "mysql://u:p@h/db?timeout=x", "mysql://u@h/a/b", "mysql:x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		cfg, _, err := ParseMySQLURL(spec)
		if err != nil {
			if u, perr := url.Parse(spec); perr == nil && u.User != nil {
				if p, ok := u.User.Password(); ok && len(p) >= 4 && strings.Contains(err.Error(), p) && !strings.Contains(redact(spec), p) {
					t.Fatalf("the error for %q shows the password: %v", spec, err)
				}
			}
			return
		}
		if cfg.User == "" || cfg.DBName == "" || cfg.Net != "tcp" {
			t.Fatalf("ParseMySQLURL(%q) = %+v", spec, cfg)
		}
		if _, port, err := net.SplitHostPort(cfg.Addr); err != nil || port == "" {
			t.Fatalf("ParseMySQLURL(%q): address %q", spec, cfg.Addr)
		}
	})
}

func TestParseMySQLURL(t *testing.T) {
	t.Parallel()
	cfg, table, err := ParseMySQLURL("mysql://app:s%40cret@db.example:3307/shop?idem_table=records&readTimeout=2s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "app" || cfg.Passwd != "s@cret" || cfg.Addr != "db.example:3307" || cfg.DBName != "shop" || table != "records" {
		t.Errorf("parsed %+v, table %q", cfg, table)
	}
	if cfg.ReadTimeout.String() != "2s" || cfg.WriteTimeout == 0 || !cfg.InterpolateParams || !cfg.ParseTime {
		t.Errorf("options %+v", cfg)
	}
	if cfg, _, _ := ParseMySQLURL("mysql://root@localhost/test"); cfg == nil || cfg.Addr != "localhost:3306" {
		t.Errorf("default port: %+v", cfg)
	}
	for _, bad := range []string{"mysql://localhost/test", "mysql://root@localhost", "mysql://root@localhost/a/b", "mysql://root@/test",
		"mysql://root@h/db?timeout=soon"} {
		_, _, err := ParseMySQLURL(bad)
		if err == nil {
			t.Errorf("ParseMySQLURL(%q) succeeded", bad)
		} else if !strings.Contains(err.Error(), "mysql://USER[:PASS]@HOST[:PORT]/DB") {
			t.Errorf("ParseMySQLURL(%q): %v does not name the supported form", bad, err)
		}
	}
}
