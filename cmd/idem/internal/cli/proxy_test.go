package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestProxyFlagErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{}, "--upstream is required"},
		{[]string{"--upstream", "ftp://h"}, `must be an http:// or https:// URL`},
		{[]string{"--upstream", "http://127.0.0.1:"}, `must be an http:// or https:// URL`},
		{[]string{"--upstream", "http:///path"}, `must be an http:// or https:// URL`},
		{[]string{"--upstream", "http://h", "--lease", "1ms"}, "--lease: lease 1ms is shorter than the minimum"},
		{[]string{"--upstream", "http://h", "--ttl", "1s"}, "--ttl: ttl 1s is shorter than lease 30s"},
		{[]string{"--upstream", "http://h", "--max-request-body", "0"}, `invalid size "0": must be positive`},
		{[]string{"--upstream", "http://h", "--scope-header", "Bad Header"}, `--scope-header: scope-header "Bad Header" is not a valid header name`},
		{[]string{"--upstream", "http://h", "--log-format", "xml"}, "--log-format must be text or json"},
		{[]string{"--upstream", "http://h", "extra"}, `unexpected argument "extra"`},
		{[]string{"--upstream", "http://h", "--ttl", "2562047h47m16s"}, "--ttl: ttl 2562047h47m16s is longer than the maximum 87600h0m0s"},
		{[]string{"--upstream", "http://h", "--upstream-timeout", "2562047h"}, "--upstream-timeout: upstream-timeout 2562047h0m0s is longer than the maximum"},
		{[]string{"--upstream", "http://h", "--store", "mongodb://x"}, `--store: "mongodb://x" is not a store idem knows`},
		{[]string{"--upstream", "http://h", "--store", "mysql://x"}, `--store: "mysql://x" is not a MariaDB URL (no user); use mysql://USER[:PASS]@HOST[:PORT]/DB`},
		{[]string{"--upstream", "http://h", "--store", "localhost:6379"}, `--store: "localhost:6379" is a server address, not a file`},
	} {
		var stderr syncBuffer
		code := Main(context.Background(), append([]string{"proxy"}, c.args...), io.Discard, &stderr)
		if code != exitUsage || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit %d and %q", c.args, code, stderr.String(), exitUsage, c.want)
		}
	}
}

func TestProxyHelp(t *testing.T) {
	t.Parallel()
	var stderr syncBuffer
	if code := Main(context.Background(), []string{"proxy", "--help"}, &stderr, io.Discard); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	for _, w := range []string{"--upstream  [IDEM_UPSTREAM]", "--store  [IDEM_STORE] (default idem-proxy.db)", "--check-config",
		"--scope-header  [IDEM_SCOPE_HEADER] (default Authorization)", "--max-request-body  [IDEM_MAX_REQUEST_BODY] (default 1MiB)",
		"/healthz", "--admin-addr", "(default 127.0.0.1:8080)"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("help lacks %q", w)
		}
	}
}

// TestProxyCheckConfigRefusesHugeTTL: a route's ttl beyond the maximum,
// which would overflow every expiry, fails --check-config (and the start).
func TestProxyCheckConfigRefusesHugeTTL(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(path, []byte("routes:\n  \"POST /payments\":\n    ttl: 2562047h47m16s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr syncBuffer
	code := Main(context.Background(), []string{"proxy", "--check-config", path}, &stdout, &stderr)
	if code != exitError || !strings.Contains(stderr.String(), path+":3:5:") || !strings.Contains(stderr.String(), "longer than the maximum") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	code = Main(context.Background(), []string{"proxy", "--config", path, "--upstream", "http://127.0.0.1:9", "--store", "memory"}, &stdout, &stderr)
	if code != exitError {
		t.Fatalf("started with the file: exit %d", code)
	}
}

// TestProxyCheckConfigReadsFlags: --check-config resolves routes against
// the flags, which also come from IDEM_* variables.
func TestProxyCheckConfigReadsFlags(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "routes.yaml")
	os.WriteFile(file, []byte("routes:\n  \"POST /payments\":\n    ttl: 2m\n"), 0o644)
	var stdout, stderr syncBuffer
	if code := Main(context.Background(), []string{"proxy", "--check-config", file}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "ok, 1 route(s)") || !strings.Contains(stdout.String(), "ttl 2m0s") {
		t.Fatalf("stdout: %s", stdout.String())
	}
	t.Setenv("IDEM_LEASE", "5m")
	stdout, stderr = syncBuffer{}, syncBuffer{}
	if code := Main(context.Background(), []string{"proxy", "--check-config", file}, &stdout, &stderr); code != exitError {
		t.Fatalf("exit %d with a lease longer than the route's ttl", code)
	}
	if want := file + `:3:5: route "POST /payments": ttl 2m0s is shorter than lease 5m0s`; !strings.Contains(stderr.String(), want) {
		t.Fatalf("stderr %q lacks %q", stderr.String(), want)
	}
}

// TestProxyCheckConfigShowsFingerprintFields: --check-config says which
// body fields each route's fingerprint covers.
func TestProxyCheckConfigShowsFingerprintFields(t *testing.T) {
	file := filepath.Join(t.TempDir(), "routes.yaml")
	os.WriteFile(file, []byte("routes:\n  \"POST /a\":\n    fingerprint_exclude: [/client_time, /trace/id]\n"+
		"  \"POST /b\":\n    fingerprint_include: [/amount]\n  \"POST /c\": {}\n"), 0o600)
	var stdout, stderr syncBuffer
	if code := Main(context.Background(), []string{"proxy", "--check-config", file}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, want := range []string{
		"POST /a\n", "fingerprint covers the whole body except /client_time, /trace/id\n",
		"fingerprint covers only /amount (with the method and target)\n", "fingerprint covers the whole body\n",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, stdout.String())
		}
	}
}

// TestProxyServesAndStops runs `idem proxy` in this process on the memory
// store: a retry replays, and cancelling the context (as a signal does)
// stops it with exit 0.
func TestProxyServesAndStops(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"ok":true}`)
	}))
	defer up.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"proxy", "--addr", "127.0.0.1:0", "--upstream", up.URL, "--store", "memory", "--log-format", "json"}, io.Discard, pw)
		pw.Close()
	}()
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "idem proxy listening" {
				addr <- line.Addr
			}
		}
	}()
	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case <-time.After(20 * time.Second):
		t.Fatal("idem proxy did not start")
	}
	post := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, base+"/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "k-1")
		req.Header.Set("Authorization", "Bearer client-1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if r := post(); r.StatusCode != http.StatusCreated || r.Header.Get("Idempotency-Replayed") != "false" {
		t.Fatalf("first: %d %v", r.StatusCode, r.Header)
	}
	if r := post(); r.Header.Get("Idempotency-Replayed") != "true" || calls.Load() != 1 {
		t.Fatalf("retry: %v, upstream ran %d", r.Header, calls.Load())
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("exit %d", code)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("idem proxy did not stop")
	}
}
