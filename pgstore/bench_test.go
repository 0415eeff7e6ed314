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
// commits (Config.AsyncClaim), on pgx (New) and on database/sql (NewDB,
// the "sql-" paths), each path on a fresh schema:
//
//	go test -run '^$' -bench Store -benchmem .
func BenchmarkStore(b *testing.B) {
	for _, c := range []struct {
		name       string
		async, sql bool
	}{{"sync", false, false}, {"async-claim", true, false}, {"sql-sync", false, true}} {
		b.Run(c.name, func(b *testing.B) {
			storetest.Benchmark(b, storetest.BenchHarness{
				NewStore: func(b *testing.B) idemstore.Store {
					// Enough connections for the parallel run's workers
					// (8 per GOMAXPROCS), so the pool is not what is measured.
					conns := 8*runtime.GOMAXPROCS(0) + 2
					pool := newPool(b, int32(conns))
					cfg := &pgstore.Config{Schema: freshSchema(b, pool), AsyncClaim: c.async}
					var (
						s   *pgstore.Store
						err error
					)
					if c.sql {
						db, oerr := openSQL(conns)
						if oerr != nil {
							b.Fatal(oerr)
						}
						b.Cleanup(func() { _ = db.Close() })
						s, err = pgstore.NewDB(context.Background(), db, cfg)
					} else {
						s, err = pgstore.New(context.Background(), pool, cfg)
					}
					if err != nil {
						b.Fatal(err)
					}
					return s
				},
			})
		})
	}
}
