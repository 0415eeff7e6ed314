package idemkafka_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// kfake cluster, kgo client and consumer a test starts must be stopped by
// the test's own cleanup.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
