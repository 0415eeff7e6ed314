package memstore_test

import (
	"testing"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
	"github.com/idemhq/idem/storetest"
)

// BenchmarkStore measures the store on the shared benchmark of every store
// (storetest.Benchmark):
//
//	go test -run '^$' -bench Store -benchmem ./memstore
func BenchmarkStore(b *testing.B) {
	storetest.Benchmark(b, storetest.BenchHarness{
		NewStore: func(b *testing.B) idemstore.Store {
			s, err := memstore.New(nil)
			if err != nil {
				b.Fatal(err)
			}
			return s
		},
	})
}
