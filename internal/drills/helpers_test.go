package drills_test

import (
	"context"
	crand "crypto/rand"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// long reports whether IDEM_DRILL_LONG is set: the drills and checkers
// then run the longer versions whose results docs/operations.md reports.
// CI runs the short ones (seconds each).
func long() bool { return os.Getenv("IDEM_DRILL_LONG") != "" }

// scale returns short in CI, long with IDEM_DRILL_LONG.
func scale[T any](short, long_ T) T {
	if long() {
		return long_
	}
	return short
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func postgresURL() string {
	return envOr("IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

func redisURL() string { return envOr("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0") }

// unreachable skips the test on a developer's machine and fails it in CI.
func unreachable(tb testing.TB, what string, err error) {
	tb.Helper()
	if os.Getenv("CI") != "" {
		tb.Fatalf("%s unreachable (CI is set): %v", what, err)
	}
	tb.Skipf("%s unreachable (set CI to make this fail): %v", what, err)
}

// newPool opens a pool on url (the test PostgreSQL by default), closed when
// tb ends.
func newPool(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.MaxConns = 8
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		if pool != nil {
			pool.Close()
		}
		unreachable(tb, "PostgreSQL at "+url, err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// newPGStore returns a pgstore in a fresh schema of pool (cfg.Schema, or a
// random name if empty), dropped when tb ends.
func newPGStore(tb testing.TB, pool *pgxpool.Pool, cfg pgstore.Config) *pgstore.Store {
	tb.Helper()
	if cfg.Schema == "" {
		cfg.Schema = newSchemaName()
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{cfg.Schema}.Sanitize()+" CASCADE"); err != nil {
			tb.Errorf("dropping schema %s: %v", cfg.Schema, err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := pgstore.New(ctx, pool, &cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// newRedis returns a client of the test Redis, closed when tb ends.
func newRedis(tb testing.TB) *redis.Client {
	tb.Helper()
	opts, err := redis.ParseURL(redisURL())
	if err != nil {
		tb.Fatal(err)
	}
	opts.MaintNotificationsConfig = noMaint()
	c := redis.NewClient(opts)
	tb.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		unreachable(tb, "Redis at "+redisURL(), err)
	}
	return c
}

// redisPrefix returns a fresh key prefix on c whose keys are deleted when
// tb ends.
func redisPrefix(tb testing.TB, c *redis.Client) string {
	prefix := "drill:" + crand.Text() + ":"
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		keys, err := c.Keys(ctx, prefix+"*").Result()
		if err == nil && len(keys) > 0 {
			err = c.Del(ctx, keys...).Err()
		}
		if err != nil {
			tb.Errorf("deleting %s*: %v", prefix, err)
		}
	})
	return prefix
}

func itoa(i int) string { return strconv.Itoa(i) }

func newSchemaName() string { return "drill_" + strings.ToLower(crand.Text()[:12]) }

// noMaint turns off go-redis's maintenance notifications: their
// handshake's fallback races (go-redis v9.23) with the dedicated
// connections redisstore's WaitReplicas uses, and idem does not use them.
func noMaint() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}
