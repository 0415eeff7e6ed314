package sqlitestore_test

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/idemhq/idem/storetest"
)

// open returns a store on a fresh file in the test's temporary directory.
func open(t *testing.T) (*sqlitestore.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	s, err := sqlitestore.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		NewStore: func(t *testing.T) idemstore.Store {
			s, _ := open(t)
			return s
		},
		DeferredTakeOver: true,
	})
}
