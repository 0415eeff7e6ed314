package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/idemhq/idem/storetest"
	"github.com/redis/go-redis/v9"
)

func TestConformanceEncrypted(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	storetest.Run(t, storetest.Harness{
		NewStore:     func(t *testing.T) idemstore.Store { return newStore(t, c, nil) },
		ServerClock:  true,
		SelfExpiring: true,
		HashedKeys:   true,
		ScanOrder:    true,
		Encryption:   storetest.Encryption(t),
	})
}

func TestEncryptionAtRest(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	storetest.RunAtRest(t, storetest.AtRestHarness{
		NewStore: func(t *testing.T) (idemstore.Store, storetest.Raw) {
			prefix := newPrefix(t, c)
			return newStore(t, c, &redisstore.Config{Prefix: prefix}), redisRaw{c: c, prefix: prefix}
		},
	})
}

// redisRaw reads the store's keys with go-redis, as redis-cli would. A
// record is a hash; its response is the field "r".
type redisRaw struct {
	c      *redis.Client
	prefix string
}

func (r redisRaw) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Dump returns every key name under the prefix with every field and value
// of its hash.
func (r redisRaw) Dump(t *testing.T) []byte {
	t.Helper()
	ctx := r.ctx(t)
	var all []byte
	iter := r.c.Scan(ctx, 0, r.prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		name := iter.Val()
		all = append(all, name...)
		m, err := r.c.HGetAll(ctx, name).Result()
		if err != nil {
			t.Fatalf("HGETALL %s: %v", name, err)
		}
		for f, v := range m {
			all = append(append(all, f...), v...)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return all
}

func (r redisRaw) name(scope, key string) string {
	// The store's own naming, from a store on the same prefix.
	s, _ := redisstore.New(r.c, &redisstore.Config{Prefix: r.prefix})
	return s.Key(scope, key)
}

func (r redisRaw) Response(t *testing.T, scope, key string) []byte {
	t.Helper()
	b, err := r.c.HGet(r.ctx(t), r.name(scope, key), "r").Bytes()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (r redisRaw) SetResponse(t *testing.T, scope, key string, b []byte) {
	t.Helper()
	name := r.name(scope, key)
	if n, err := r.c.Exists(r.ctx(t), name).Result(); err != nil || n != 1 {
		t.Fatalf("SetResponse: %s exists %d: %v", name, n, err)
	}
	if err := r.c.HSet(r.ctx(t), name, "r", b).Err(); err != nil {
		t.Fatal(err)
	}
}
