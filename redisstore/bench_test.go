package redisstore_test

import (
	"runtime"
	"testing"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/idemhq/idem/storetest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkStore measures the store on the shared benchmark of every store
// (storetest.Benchmark), each path under a fresh key prefix, on a client
// with the options README.md recommends:
//
//	go test -run '^$' -bench Store -benchmem .
func BenchmarkStore(b *testing.B) {
	storetest.Benchmark(b, storetest.BenchHarness{
		NewStore: func(b *testing.B) idemstore.Store {
			c := newClient(b)
			// Enough connections for the parallel run's workers (8 per
			// GOMAXPROCS), so the pool is not what is measured.
			opts := c.Options()
			opts.PoolSize = 8*runtime.GOMAXPROCS(0) + 2
			redisstore.RecommendOptions(opts)
			big := redis.NewClient(opts)
			b.Cleanup(func() { _ = big.Close() })
			return newStore(b, big, nil)
		},
	})
}
