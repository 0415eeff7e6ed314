package payments

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/idemhq/idem/sqlitestore"
	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// goroutine a test starts (servers, renewers, waiters, clients' pools) must
// be stopped by the test's own cleanup.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// openSQLite opens a store on a new SQLite file in the test's temporary
// directory, closed when the test ends.
func openSQLite(t *testing.T) *sqlitestore.Store {
	t.Helper()
	s, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "pay.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
