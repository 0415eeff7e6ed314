package idemfiber_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them: every
// goroutine a test starts (servers, clients) must be stopped by the test's
// own cleanup. Two of fasthttp's are not the tests' to stop: the clock that
// formats the Date field runs for the life of the process, and a stopped
// server's worker-pool cleaner notices the stop only when its sleep ends.
// The benchmark adds two that live as long as the process: the garbage
// collector of the memory storage Fiber's own idempotency middleware
// starts, and the clock its storage reads.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/gofiber/fiber/v3/internal/storage/memory.(*Storage).gc"),
		goleak.IgnoreAnyFunction("github.com/gofiber/utils/v2.StartTimeStampUpdater.func1.1"),
	)
}
