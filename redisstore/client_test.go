package redisstore_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// With the client options README.md recommends (no socket health check
// before a command), a connection that Redis closed is found by the
// command that uses it, and go-redis sends that command again on a new
// connection: the store call succeeds.
func TestRecommendedClientAfterRedisClosedConnection(t *testing.T) {
	t.Parallel()
	admin := newClient(t)
	opts := admin.Options()
	opts.PoolSize = 1 // one connection: the one Redis closes
	redisstore.RecommendOptions(opts)
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	s := newStore(t, c, nil)
	p := idemstore.ClaimParams{Scope: "s", Key: "k", Fingerprint: "fp", Token: "owner", Lease: time.Minute, TTL: time.Hour}
	mustAcquire(t, s, p)

	id, err := c.ClientID(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if n, err := admin.ClientKillByFilter(t.Context(), "ID", strconv.FormatInt(id, 10)).Result(); err != nil || n != 1 {
		t.Fatalf("CLIENT KILL ID %d: %d killed, %v", id, n, err)
	}
	resp := &idemstore.Response{StatusCode: 201, Body: []byte("created")}
	if err := s.Complete(t.Context(), idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: resp}); err != nil {
		t.Fatalf("Complete on the closed connection: %v", err)
	}
	if id2, err := c.ClientID(t.Context()).Result(); err != nil || id2 == id {
		t.Fatalf("client ID after the kill: %d (was %d), %v", id2, id, err)
	}
}
