package sqlitestore_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/idemhq/idem/storetest"
)

// BenchmarkStore measures the store on the shared benchmark of every store
// (storetest.Benchmark), on a fresh file per path:
//
//	go test -run '^$' -bench Store -benchmem .
func BenchmarkStore(b *testing.B) {
	storetest.Benchmark(b, storetest.BenchHarness{
		NewStore: func(b *testing.B) idemstore.Store {
			s, err := sqlitestore.Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"), nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		},
	})
}
