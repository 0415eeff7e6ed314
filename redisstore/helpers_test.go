package redisstore_test

import (
	"context"
	crand "crypto/rand"
	"os"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// redisURL is the Redis the tests use: IDEM_TEST_REDIS_URL, or the one on
// this machine.
func redisURL() string {
	if u := os.Getenv("IDEM_TEST_REDIS_URL"); u != "" {
		return u
	}
	return "redis://127.0.0.1:6379/0"
}

// newClient returns a client of the test Redis, closed when t ends. If
// Redis cannot be reached the test is skipped, unless CI is set: then it
// fails, so that a broken CI setup cannot pass by skipping.
func newClient(tb testing.TB) *redis.Client {
	tb.Helper()
	opts, err := redis.ParseURL(redisURL())
	if err != nil {
		tb.Fatalf("IDEM_TEST_REDIS_URL: %v", err)
	}
	c := redis.NewClient(opts)
	tb.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		if os.Getenv("CI") == "" {
			tb.Skipf("Redis at %s unreachable (set CI to make this fail): %v", redisURL(), err)
		}
		tb.Fatalf("Redis at %s unreachable: %v", redisURL(), err)
	}
	return c
}

// newPrefix returns a key prefix no other test uses, and deletes every key
// under it when tb ends. Tests share the Redis server with others running at
// the same time, so they never flush it.
func newPrefix(tb testing.TB, c redis.UniversalClient) string {
	tb.Helper()
	prefix := "idemtest:" + crand.Text() + ":"
	tb.Cleanup(func() { deletePrefix(tb, c, prefix) })
	return prefix
}

func deletePrefix(tb testing.TB, c redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		tb.Errorf("cleanup: scanning %s*: %v", prefix, err)
		return
	}
	for len(keys) > 0 {
		n := min(len(keys), 500)
		if err := c.Del(ctx, keys[:n]...).Err(); err != nil {
			tb.Errorf("cleanup: deleting %d keys: %v", n, err)
			return
		}
		keys = keys[n:]
	}
}

// newStore returns a store on c under a fresh prefix.
func newStore(tb testing.TB, c redis.UniversalClient, cfg *redisstore.Config) *redisstore.Store {
	tb.Helper()
	var conf redisstore.Config
	if cfg != nil {
		conf = *cfg
	}
	if conf.Prefix == "" {
		conf.Prefix = newPrefix(tb, c)
	}
	s, err := redisstore.New(c, &conf)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return s
}

// mustAcquire claims p on s and stops the test unless the claim acquired
// the key.
func mustAcquire(tb testing.TB, s *redisstore.Store, p idemstore.ClaimParams) idemstore.ClaimResult {
	tb.Helper()
	r, err := s.Claim(tb.Context(), p)
	if err != nil || r.Outcome != idemstore.ClaimAcquired {
		tb.Fatalf("Claim %s: %v %v", p.Key, r.Outcome, err)
	}
	return r
}
