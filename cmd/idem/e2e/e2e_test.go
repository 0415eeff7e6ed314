// Package e2e tests `idem serve` end to end: real idem processes on free
// ports, sharing one PostgreSQL database, one Redis (through a key prefix)
// or one SQLite file, driven over real HTTP. The scenarios are the ones a
// deployment of several instances depends on: simultaneous duplicates
// spread over the instances run once, a SIGKILL in the middle of an
// operation leaves nothing behind and its key is taken over after the
// lease, a replay is the same bytes from every instance, and an
// unreachable records store answers 503 without running the operation and
// recovers by itself.
//
// TestMain builds the idem binary once (with -race when the tests run with
// -race, so that the server's own data races fail the tests too), unless
// IDEM_E2E_BIN names one.
//
// Server-backed tests read IDEM_TEST_POSTGRES_URL and IDEM_TEST_REDIS_URL
// (defaults below). They skip when the server is unreachable and CI is
// unset, and fail when CI is set. Every test isolates itself on the shared
// servers: a fresh database (dropped afterwards) on PostgreSQL, a fresh key
// prefix (its keys deleted afterwards) on Redis.
package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemhq/idem/cmd/idem/internal/cli"
)

// Default server addresses, overridden by the environment.
const (
	defaultPostgresURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultRedisURL    = "redis://127.0.0.1:6379/0"
)

// idemBin is the path of the idem binary TestMain built.
var idemBin string

func TestMain(m *testing.M) {
	flag.Parse() // for testing.Verbose
	// go test replays a cached result while the test binary's contents
	// are unchanged, and the server under test is built separately. So
	// the server's code (cli.Main and all it reaches: core, stores,
	// payments) is linked into the test binary too: a change to it
	// changes the test binary, and the tests run again. The condition is
	// never true; it only keeps the linker from discarding the code.
	if len(os.Args) == 0 {
		os.Exit(cli.Main(context.Background(), nil, os.Stdout, os.Stderr))
	}
	os.Exit(leaked(run(m)))
}

// run builds the binary into a temporary directory that outlives every
// test, and removes it afterwards (os.Exit in TestMain would skip defers).
// IDEM_E2E_BIN names a binary to test instead (a release build, or one
// broken on purpose to check that the tests fail).
func run(m *testing.M) int {
	if bin := os.Getenv("IDEM_E2E_BIN"); bin != "" {
		abs, err := filepath.Abs(bin)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e: IDEM_E2E_BIN:", err)
			return 1
		}
		idemBin = abs
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "idem-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	idemBin = filepath.Join(dir, "idem")
	args := []string{"build", "-o", idemBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/idemhq/idem/cmd/idem")
	start := time.Now()
	cmd := exec.Command("go", args...)
	cmd.Dir = ".." // the module directory: this package is cmd/idem/e2e
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go %v: %v\n", args, err)
		return 1
	}
	if testing.Verbose() {
		fmt.Fprintf(os.Stderr, "e2e: built idem (race=%v) in %v\n", raceEnabled, time.Since(start).Round(time.Millisecond))
	}
	return m.Run()
}

// binary returns the idem binary to run. It reads IDEM_E2E_BIN again from
// the test, where go test records the environment a run depended on
// (TestMain runs before the recording starts), so that a cached result is
// not replayed for another IDEM_E2E_BIN. go test does not record files
// outside the module, so a changed binary at the same path still needs
// -count=1.
func binary(t *testing.T) string {
	t.Helper()
	os.Getenv("IDEM_E2E_BIN")
	return idemBin
}

// envOr returns the environment variable name, or def if it is unset.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// requireReachable skips the test when nothing answers at address and CI
// is unset; with CI set it fails the test instead, so that a CI run never
// passes by skipping. Any failure after the server answered is a test
// failure, never a skip.
func requireReachable(t *testing.T, what, network, address string) {
	t.Helper()
	c, err := net.DialTimeout(network, address, 3*time.Second)
	if err == nil {
		c.Close()
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s at %s is unreachable (CI is set, so this fails instead of skipping): %v", what, address, err)
	}
	t.Skipf("%s at %s is unreachable: %v", what, address, err)
}

// randomName returns n random bytes in hex, to name databases, key
// prefixes and idempotency keys.
func randomName(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}

// testContext returns a context that ends with the test, bounded so that
// a hung server cannot hang the whole run.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
