package redisstore_test

import (
	"testing"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/storetest"
)

func TestConformance(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	storetest.Run(t, storetest.Harness{
		NewStore:     func(t *testing.T) idemstore.Store { return newStore(t, c, nil) },
		ServerClock:  true,
		SelfExpiring: true,
		HashedKeys:   true,
		ScanOrder:    true,
	})
}
