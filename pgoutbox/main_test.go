package pgoutbox_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: a
// dispatcher, a consumer or a connection not stopped.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
