package datalayertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// The servers' defaults, as the other tests of the repository use them;
// IDEM_TEST_POSTGRES_URL names another.
const (
	defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
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
