package console

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them (the
// background count, servers, pools).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
