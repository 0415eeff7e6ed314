package memstore_test

import (
	"testing"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
	"github.com/idemhq/idem/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		NewStore: func(t *testing.T) idemstore.Store {
			s, err := memstore.New(nil)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}
