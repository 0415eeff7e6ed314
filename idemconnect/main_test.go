package idemconnect_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// server and client a test starts must be stopped by its own cleanup.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
