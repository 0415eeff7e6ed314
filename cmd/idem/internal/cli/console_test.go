package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// idem console refuses, before opening anything, an address others can
// reach without a token, a short token, memory, and a missing SQLite
// file; serve and proxy refuse a non-loopback --console-addr likewise.
func TestConsoleFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"console", "--store", filepath.Join(dir, "x.db"), "--addr", "0.0.0.0:0"}, exitUsage, "--console-token-file"},
		{[]string{"console", "--store", filepath.Join(dir, "x.db"), "--console-token-file", short}, exitUsage, "at least 16 characters"},
		{[]string{"console", "--store", "memory"}, exitUsage, "one process"},
		{[]string{"console", "--store", filepath.Join(dir, "missing.db")}, exitError, "no such file"},
		{[]string{"console", "--ttl", "0"}, exitUsage, "--ttl must be positive"},
		{[]string{"serve", "--db", filepath.Join(dir, "s.db"), "--console-addr", "10.1.2.3:8089"}, exitUsage, "not a loopback address"},
		{[]string{"proxy", "--upstream", "http://127.0.0.1:1", "--store", "memory", "--console-addr", "[::]:8089"}, exitUsage, "not a loopback address"},
	} {
		var stdout, stderr bytes.Buffer
		code := Main(context.Background(), c.args, &stdout, &stderr)
		if code != c.code || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("idem %s = %d, stderr %q; want %d and %q", strings.Join(c.args, " "), code, stderr.String(), c.code, c.want)
		}
	}
	var stdout bytes.Buffer
	if code := Main(context.Background(), []string{"--help"}, &stdout, &stdout); code != exitOK || !strings.Contains(stdout.String(), "console") {
		t.Errorf("idem --help does not list console:\n%s", stdout.String())
	}
}
