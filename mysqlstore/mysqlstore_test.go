package mysqlstore_test

import (
	"testing"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/mysqlstore"
	"github.com/idemhq/idem/storetest"
)

// The whole contract holds with server-side prepared statements (the
// driver's default) and with client-side interpolation
// (interpolateParams=true), and with duplicates answered by a read before
// any insert (Config.ReadFirst).
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		interpolate bool
		cfg         *mysqlstore.Config
	}{{"prepared", false, nil}, {"interpolated", true, nil}, {"read-first", true, &mysqlstore.Config{ReadFirst: true}}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, storetest.Harness{
				NewStore:    func(t *testing.T) idemstore.Store { return newFixtureOn(t, sharedDB(t, c.interpolate), c.cfg).store },
				ServerClock: true,
			})
		})
	}
}
