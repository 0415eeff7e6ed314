// Package checktest runs `idem check` against an example server: it builds
// the idem binary once per test binary, from the workspace, and fails the
// test unless every check passes.
package checktest

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/examples/internal/orders"
	"github.com/idemhq/idem/sqlitestore"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildOut  []byte
)

// idemBinary builds cmd/idem (without -race: it is the grader, not the code
// under test) into a temporary directory. It needs the workspace (go.work),
// where the cmd/idem module lives; without one the test is skipped.
func idemBinary(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOWORK").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == "off" {
		t.Skip("no go.work: idem check is built from the workspace's cmd/idem module")
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "idem-check-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "idem")
		buildOut, buildErr = exec.Command("go", "build", "-o", binPath, "github.com/idemhq/idem/cmd/idem").CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("go build cmd/idem: %v\n%s", buildErr, buildOut)
	}
	return binPath
}

// Run runs `idem check --json` with args and the URL, and fails t unless the
// command exits 0 and every check passed (or was skipped for a reason that
// is not a failure).
func Run(t *testing.T, url string, args ...string) {
	t.Helper()
	bin := idemBinary(t)
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(t.Context(), bin, append(append([]string{"check", "--json"}, args...), url)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var report struct {
		Checks []struct{ Name, Status, Reason string }
	}
	if jerr := json.Unmarshal(stdout.Bytes(), &report); jerr != nil {
		t.Fatalf("idem check: %v; report: %v\n%s\n%s", err, jerr, stdout.String(), stderr.String())
	}
	if len(report.Checks) < 10 {
		t.Errorf("only %d checks ran", len(report.Checks))
	}
	for _, c := range report.Checks {
		switch c.Status {
		case "PASS":
		case "SKIP":
			t.Logf("%s: skipped (%s)", c.Name, c.Reason)
		default:
			t.Errorf("%s: %s (%s)", c.Name, c.Status, c.Reason)
		}
	}
	if err != nil {
		t.Errorf("idem check: %v\n%s", err, stderr.String())
	}
}

// Args are the idem check flags every orders example is graded with: a
// valid order, and two tenants.
func Args() []string {
	return []string{"--body", `{"item":"book","quantity":1}`,
		"--header", "Authorization: Bearer tenant-a", "--second-tenant-header", "Authorization: Bearer tenant-b"}
}

// OrdersMatchExecutions sends simultaneous duplicates of one new order, then
// retries it until it gets the stored response, and fails t unless exactly
// one order was written: the order and the record commit together.
func OrdersMatchExecutions(t *testing.T, url string, store *sqlitestore.Store) {
	t.Helper()
	before, err := orders.Count(t.Context(), store)
	if err != nil {
		t.Fatal(err)
	}
	key := `"` + rand.Text() + `"`
	send := func() (int, string, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(`{"item":"lamp","quantity":2}`))
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	const n = 8
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if code, body, err := send(); err != nil || (code != http.StatusCreated && code != http.StatusConflict) {
				errs <- fmt.Errorf("duplicate: %d %s %v", code, body, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body, err := send()
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusCreated {
			break
		}
		if code != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("retry: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond) // a retry's pause, as Retry-After asks
	}
	after, err := orders.Count(t.Context(), store)
	if err != nil {
		t.Fatal(err)
	}
	if after != before+1 {
		t.Errorf("%d orders written for one key, want 1", after-before)
	}
}

// Example serves the handler newHandler builds on a fresh orders database
// with httptest, runs every check against its POST /orders and checks that
// one order exists per execution: the test of each HTTP example.
func Example(t *testing.T, newHandler func(*sqlitestore.Store) (http.Handler, error)) {
	store, err := orders.Open(t.Context(), filepath.Join(t.TempDir(), "orders.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	h, err := newHandler(store)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	Run(t, srv.URL+"/orders", Args()...)
	OrdersMatchExecutions(t, srv.URL+"/orders", store)
}
