package mysqloutbox_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// goroutine a test starts (dispatchers, consumers, clients' pools) must be
// stopped by the test's own cleanup.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
