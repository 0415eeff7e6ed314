package pgstore_test

import (
	"context"
	"runtime"
	"testing"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/storetest"
)

// BenchmarkStore measures the store on the shared benchmark of every store
// (storetest.Benchmark), with synchronous and with asynchronous claim
// commits (Config.AsyncClaim), each path on a fresh schema:
//
//	go test -run '^$' -bench Store -benchmem .
func BenchmarkStore(b *testing.B) {
	for _, c := range []struct {
		name  string
		async bool
	}{{"sync", false}, {"async-claim", true}} {
		b.Run(c.name, func(b *testing.B) {
			storetest.Benchmark(b, storetest.BenchHarness{
				NewStore: func(b *testing.B) idemstore.Store {
					// Enough connections for the parallel run's workers
					// (8 per GOMAXPROCS), so the pool is not what is measured.
					pool := newPool(b, int32(8*runtime.GOMAXPROCS(0)+2))
					s, err := pgstore.New(context.Background(), pool,
						&pgstore.Config{Schema: freshSchema(b, pool), AsyncClaim: c.async})
					if err != nil {
						b.Fatal(err)
					}
					return s
				},
			})
		})
	}
}
