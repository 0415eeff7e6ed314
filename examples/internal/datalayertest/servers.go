package datalayertest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
)

// The servers' defaults, as the other tests of the repository use them;
// IDEM_TEST_POSTGRES_URL and IDEM_TEST_MYSQL_URL (a go-sql-driver DSN)
// name others.
const (
	defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultMySQLURL    = "root@tcp(127.0.0.1:3306)/test"
)

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// unreachable skips the test when a server cannot be reached on a
// developer's machine, and fails it in CI.
func unreachable(t *testing.T, server string, err error) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is unreachable (CI is set): %v", server, err)
	}
	t.Skipf("%s is unreachable: %v", server, err)
}

// freshName is a new schema or database name.
func freshName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "datalayer_" + hex.EncodeToString(b)
}

// freshPostgres creates a schema, dropped at cleanup, and returns the URL
// whose search_path is that schema.
func freshPostgres(t *testing.T) string {
	base := env("IDEM_TEST_POSTGRES_URL", defaultPostgresURL)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		unreachable(t, "PostgreSQL", err)
	}
	schema := freshName()
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		conn.Close(ctx)
		t.Fatal(err)
	}
	conn.Close(ctx)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// freshMySQL creates a database, dropped at cleanup, and returns its DSN.
func freshMySQL(t *testing.T) string {
	cfg, err := mysql.ParseDSN(env("IDEM_TEST_MYSQL_URL", defaultMySQLURL))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Timeout = 5 * time.Second
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		unreachable(t, "MariaDB", err)
	}
	name := freshName()
	if _, err := db.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		db.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := db.ExecContext(ctx, "DROP DATABASE "+name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	cfg.DBName = name
	return cfg.FormatDSN()
}
