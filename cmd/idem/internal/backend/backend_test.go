package backend

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestKindOf(t *testing.T) {
	for spec, want := range map[string]Kind{
		"idem.db": SQLite, "/var/lib/idem/x.db": SQLite, "memory": Memory, "MEMORY": Memory,
		"./localhost:6379": SQLite, `C:\idem\x.db`: SQLite, "data/a:b.db": SQLite,
		"postgres://u@h/db": Postgres, "postgresql://h/db": Postgres, "POSTGRES://h/db": Postgres,
		"mysql://root@127.0.0.1:3306/test": MySQL, "MariaDB://u:p@h/db": MySQL,
		"redis://127.0.0.1:6379/0": Redis, "rediss://h:6380": Redis, "REDIS://h:6379": Redis, "Rediss://h": Redis,
	} {
		if got, err := KindOf(spec); got != want || err != nil {
			t.Errorf("KindOf(%q) = %s, %v; want %s", spec, got, err, want)
		}
	}
}

// A value that looks like a URL but names no store is an error naming the
// supported forms, never a SQLite file name.
func TestKindOfUnknownScheme(t *testing.T) {
	for _, spec := range []string{"localhost:6379", "mongodb://x", "http://h/db", "sqlite3:x.db", "127.0.0.1:6379", ""} {
		k, err := KindOf(spec)
		if err == nil {
			t.Errorf("KindOf(%q) = %s, want an error", spec, k)
			continue
		}
		if !strings.Contains(err.Error(), "postgres://") || !strings.Contains(err.Error(), "redis://") {
			t.Errorf("KindOf(%q): %v does not name the supported forms", spec, err)
		}
	}
	dir := t.TempDir()
	t.Chdir(dir)
	if _, err := Open(context.Background(), "localhost:6379"); err == nil {
		t.Fatal("Open(localhost:6379) succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, "localhost:6379")); err == nil {
		t.Fatal("Open(localhost:6379) created a file of that name")
	}
}

// Upper-case schemes reach pgx and go-redis in lower case, which they
// require.
func TestNormalise(t *testing.T) {
	for in, want := range map[string]string{
		"REDIS://h:6379/0":   "redis://h:6379/0",
		"PostgreSQL://u@h/d": "postgresql://u@h/d",
		"idem.db":            "idem.db",
	} {
		if got := normalise(in); got != want {
			t.Errorf("normalise(%q) = %q, want %q", in, got, want)
		}
	}
}

// mute is a listener that accepts connections and never answers, until
// the test ends.
func mute(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// A server that accepts connections but never answers makes Open fail
// after its timeout, with an error that says so, on PostgreSQL and Redis.
func TestOpenMuteServerTimesOut(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{
		"postgres://postgres@" + mute(t) + "/x?sslmode=disable",
		"redis://" + mute(t) + "/0",
	} {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		s, err := OpenWith(ctx, spec, Options{OpenTimeout: 2 * time.Second})
		cancel()
		if err == nil {
			s.Close()
			t.Fatalf("%s: opened", spec)
		}
		if took := time.Since(start); took > 20*time.Second {
			t.Errorf("%s: failed after %v", spec, took)
		}
		if !strings.Contains(err.Error(), "cannot connect") || !strings.Contains(err.Error(), "no answer after") {
			t.Errorf("%s: unclear error: %v", spec, err)
		}
	}
}

// An unreachable Redis fails at start, as an unreachable PostgreSQL does.
func TestOpenRefusedRedisFails(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if s, err := Open(context.Background(), "redis://"+addr+"/0"); err == nil {
		s.Close()
		t.Fatal("opened a Redis store where nothing listens")
	} else if !strings.Contains(err.Error(), "cannot connect") {
		t.Errorf("unclear error: %v", err)
	}
}

func TestCutQuery(t *testing.T) {
	rest, v, err := cutQuery("redis://127.0.0.1:6379/2?prefix=t1:&protocol=3", "prefix")
	if err != nil || v != "t1:" || rest != "redis://127.0.0.1:6379/2?protocol=3" {
		t.Fatalf("cutQuery = %q %q %v", rest, v, err)
	}
	rest, v, _ = cutQuery("postgres://h/db", "idem_schema")
	if rest != "postgres://h/db" || v != "" {
		t.Fatalf("absent parameter: %q %q", rest, v)
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://user:secret@host/db": "postgres://user:xxxxx@host/db",
		"redis://:pw@127.0.0.1:6379/0":   "redis://:xxxxx@127.0.0.1:6379/0",
		"postgres://user@host/db":        "postgres://user@host/db",
		"idem.db":                        "idem.db",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}
