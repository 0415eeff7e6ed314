package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/sqlitestore"
)

// syncBuffer is a goroutine-safe bytes.Buffer for a command's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServe runs `idem serve` in this process on a fresh SQLite file and a
// free port, and returns its base URL. The server stops when the test ends.
func startServe(t *testing.T, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	args := append([]string{"--addr", "127.0.0.1:0", "--db", filepath.Join(t.TempDir(), "idem.db"), "--log-format", "json"}, extra...)
	go func() {
		done <- Main(ctx, append([]string{"serve"}, args...), io.Discard, pw)
		pw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != exitOK {
				t.Errorf("idem serve exited with %d", code)
			}
		case <-time.After(40 * time.Second):
			t.Error("idem serve did not shut down")
		}
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "idem serve listening" {
				addr <- line.Addr
			}
		}
		close(addr)
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatal("idem serve exited before listening")
		}
		return "http://" + a
	case <-time.After(30 * time.Second):
		t.Fatal("idem serve did not start")
	}
	return ""
}

// TestCheckPassesAgainstServe grades the payments demo with idem check,
// its executions counted by /api/payments/count: every check must pass.
func TestCheckPassesAgainstServe(t *testing.T) {
	t.Parallel()
	url := startServe(t)
	var out, errs syncBuffer
	code := Main(context.Background(), []string{"check",
		"--body", `{"amountCents":100,"currency":"USD","reference":"check"}`,
		"--header", "Authorization: Bearer tenant-a",
		"--second-tenant-header", "Authorization: Bearer tenant-b",
		"--count-url", url + "/api/payments/count",
		"--json", url + "/api/payments"}, &out, &errs)
	if code != exitOK {
		t.Fatalf("idem check exited %d\n%s\n%s", code, out.String(), errs.String())
	}
	var report struct {
		Checks []struct{ Name, Status, Reason string }
	}
	if err := json.Unmarshal([]byte(out.String()), &report); err != nil {
		t.Fatalf("report: %v\n%s", err, out.String())
	}
	if len(report.Checks) < 11 {
		t.Fatalf("only %d checks ran", len(report.Checks))
	}
	for _, c := range report.Checks {
		if c.Status != "PASS" {
			t.Errorf("%s: %s (%s)", c.Name, c.Status, c.Reason)
		}
		if (c.Name == "replay" || c.Name == "concurrent-duplicates") && !strings.Contains(c.Reason, "executions verified") {
			t.Errorf("%s: executions not verified: %s", c.Name, c.Reason)
		}
	}
}

func TestServeRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--log-format", "xml"},
		{"--lease", "1ms"},
		{"--lease", "1h", "--ttl", "1m"},
		{"--op-delay", "-1s"},
		{"--db", "redis://127.0.0.1:6379"},
		{"--db", "mysql://x"},
		{"--db", "localhost:5432"},
		{"--store", "localhost:6379"},
		{"--store", "memcached://h"},
		{"--shutdown-timeout", "0s"},
		{"--ttl", "2562047h47m16s"},
		{"--lease", "2562047h", "--ttl", "2562047h47m16s"},
		{"--nonsense"},
		{"extra-argument"},
	} {
		var errs syncBuffer
		if code := Main(context.Background(), append([]string{"serve"}, args...), io.Discard, &errs); code != exitUsage {
			t.Errorf("serve %v: exit %d, want %d (%s)", args, code, exitUsage, errs.String())
		}
	}
}

func TestHelpListsEnvironmentVariables(t *testing.T) {
	t.Parallel()
	var help, errs syncBuffer
	if code := Main(context.Background(), []string{"serve", "--help"}, &help, &errs); code != exitOK {
		t.Fatalf("serve --help: exit %d", code)
	}
	for _, want := range []string{"--addr", "IDEM_ADDR", "--op-delay", "IDEM_OP_DELAY", "--db", "--store", "--lease", "--ttl", "--log-format", "--shutdown-timeout"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("serve --help does not mention %s on stdout:\n%s", want, help.String())
		}
	}
	if errs.String() != "" {
		t.Errorf("serve --help wrote to stderr: %s", errs.String())
	}
	var out syncBuffer
	if code := Main(context.Background(), nil, &out, io.Discard); code != exitUsage || !strings.Contains(out.String(), "serve") {
		t.Errorf("no command: exit %d\n%s", code, out.String())
	}
	if code := Main(context.Background(), []string{"bogus"}, io.Discard, io.Discard); code != exitUsage {
		t.Errorf("unknown command: exit %d", code)
	}
}

// Every command's --help and -h go to stdout with status 0; a bad flag
// goes to stderr with a pointer to --help, not the whole usage.
func TestHelpOnStdout(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"serve", "proxy", "check", "cleanup"} {
		for _, h := range []string{"--help", "-h"} {
			var out, errs syncBuffer
			code := Main(context.Background(), []string{cmd, h}, &out, &errs)
			if code != exitOK || !strings.Contains(out.String(), "Usage: idem "+cmd) || errs.String() != "" {
				t.Errorf("%s %s: exit %d, stdout %d bytes, stderr %q", cmd, h, code, len(out.String()), errs.String())
			}
		}
		var out, errs syncBuffer
		code := Main(context.Background(), []string{cmd, "--no-such-flag"}, &out, &errs)
		if code != exitUsage || out.String() != "" || strings.Contains(errs.String(), "Usage:") || !strings.Contains(errs.String(), "--help") {
			t.Errorf("%s --no-such-flag: exit %d, stdout %q, stderr %q", cmd, code, out.String(), errs.String())
		}
	}
}

// A duration without a unit, or not a duration at all, is reported with
// what a duration looks like, from a flag or its environment variable.
func TestDurationFlagMessages(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"serve", "--ttl", "-1"}, "", `"-1" has no unit: write a duration such as -1s`},
		{[]string{"proxy", "--upstream", "http://h", "--lease", "10"}, "", `"10" has no unit`},
		{[]string{"serve", "--ttl", "soon"}, "", `"soon" is not a duration`},
		{[]string{"serve"}, "5", `"5" has no unit`},
		{[]string{"serve", "--ttl", "-1s"}, "", "--ttl must be positive"},
	} {
		t.Run(strings.Join(c.args, " ")+c.env, func(t *testing.T) {
			if c.env != "" {
				t.Setenv("IDEM_TTL", c.env)
			}
			var out, errs syncBuffer
			code := Main(context.Background(), c.args, &out, &errs)
			if code != exitUsage || !strings.Contains(errs.String(), c.want) || strings.Contains(errs.String(), "parse error") || strings.Contains(errs.String(), "Usage:") {
				t.Errorf("exit %d, stderr %q; want %q", code, errs.String(), c.want)
			}
		})
	}
}

// The access log redacts a key as the core's log lines do (idem.RedactKey
// of the parsed key), so an operator can follow one key through both: the
// quoted and the bare form of a key, which are one key, hash alike.
func TestAccessLogKeyMatchesCore(t *testing.T) {
	t.Parallel()
	want := idem.RedactKey("order-4711")
	for _, vs := range [][]string{{`"order-4711"`}, {"order-4711"}} {
		if got := logKey(vs); got != want {
			t.Errorf("logKey(%q) = %s, want %s", vs, got, want)
		}
	}
	if got := logKey([]string{`"a"`, `"b"`}); got == idem.RedactKey("a") || !strings.HasPrefix(got, "sha256:") {
		t.Errorf("an invalid key: %s", got)
	}
}

func TestEnvName(t *testing.T) {
	t.Parallel()
	for flag, want := range map[string]string{"addr": "IDEM_ADDR", "op-delay": "IDEM_OP_DELAY", "second-tenant-header": "IDEM_SECOND_TENANT_HEADER"} {
		if got := envName(flag); got != want {
			t.Errorf("envName(%q) = %q, want %q", flag, got, want)
		}
	}
}

// TestFlagsFromEnvironment checks that IDEM_* variables set flags and that
// the command line wins. (Not parallel: it sets environment variables.)
func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("IDEM_LOG_FORMAT", "xml")
	t.Setenv("IDEM_DB", "redis://127.0.0.1:1")
	var errs syncBuffer
	Main(context.Background(), []string{"serve"}, io.Discard, &errs)
	if !strings.Contains(errs.String(), "--log-format must be text or json") {
		t.Errorf("IDEM_LOG_FORMAT not applied: %s", errs.String())
	}
	errs = syncBuffer{}
	Main(context.Background(), []string{"serve", "--log-format", "json"}, io.Discard, &errs)
	if strings.Contains(errs.String(), "--log-format") || !strings.Contains(errs.String(), "--db must be") {
		t.Errorf("command line did not win over IDEM_LOG_FORMAT, or IDEM_DB not applied: %s", errs.String())
	}
	t.Setenv("IDEM_LEASE", "soon")
	errs = syncBuffer{}
	if code := Main(context.Background(), []string{"serve"}, io.Discard, &errs); code != exitUsage || !strings.Contains(errs.String(), "IDEM_LEASE") {
		t.Errorf("bad IDEM_LEASE: exit %d, %s", code, errs.String())
	}
}

func TestCleanupCommand(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "c.db")
	// Three records whose retention ended an hour ago, one live.
	st, err := sqlitestore.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, age := range []time.Duration{2 * time.Hour, 2 * time.Hour, 2 * time.Hour, 0} {
		_, err := st.Claim(context.Background(), idemstore.ClaimParams{Scope: "s", Key: fmt.Sprint(i), Fingerprint: "v1:x",
			Token: "t", Lease: time.Minute, TTL: time.Hour, Now: time.Now().Add(-age)})
		if err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	var out, errs syncBuffer
	if code := Main(context.Background(), []string{"cleanup", "--store", path, "--batch", "10", "--pace"}, &out, &errs); code != exitOK {
		t.Fatalf("cleanup: exit %d: %s", code, errs.String())
	}
	if !strings.Contains(out.String(), "deleted 3 expired records") {
		t.Errorf("cleanup output: %q", out.String())
	}
	if code := Main(context.Background(), []string{"cleanup", "--batch", "0"}, io.Discard, io.Discard); code != exitUsage {
		t.Errorf("--batch 0: exit %d", code)
	}
}
