package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// go-redis logs dial failures through its package logger; the failure
	// tests provoke them on purpose.
	redis.SetLogger(quietLogger{})
	os.Exit(leaked(m.Run()))
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// leaked turns the exit code of m.Run into a failure if any goroutine
// outlives the package's tests: every goroutine a test starts (servers,
// renewers, clients' pools) must be stopped by the test's own cleanup.
// TestMain calls it after its own cleanup.
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
