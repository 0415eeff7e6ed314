package mysqlstore_test

import (
	"fmt"
	"os"

	"go.uber.org/goleak"
)

// leaked turns the exit code of m.Run into a failure if any goroutine
// outlives the package's tests. TestMain calls it after its own cleanup.
func leaked(code int) int {
	if code != 0 {
		return code
	}
	if err := goleak.Find(); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
		return 1
	}
	return 0
}
