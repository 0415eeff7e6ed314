package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// collector is an OTLP/HTTP receiver that keeps what it is sent, by path.
type collector struct {
	mu   sync.Mutex
	got  map[string][]byte
	seen chan string
}

func newCollector(t *testing.T) (*collector, string) {
	c := &collector{got: map[string][]byte{}, seen: make(chan string, 64)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		c.mu.Lock()
		c.got[r.URL.Path] = append(c.got[r.URL.Path], b...)
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	return c, srv.URL
}

func (c *collector) body(path string) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.got[path])
}

// TestServeExportsOTLP runs idem serve with OTEL_EXPORTER_OTLP_ENDPOINT set
// and checks that its traces and metrics reach the collector, with idem's
// attributes and never the key. (Not parallel: it sets the environment.)
func TestServeExportsOTLP(t *testing.T) {
	col, endpoint := newCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	t.Setenv("OTEL_SERVICE_NAME", "idem-serve-test")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(t.TempDir(), "idem.db"),
			"--log-format", "json"}, io.Discard, pw)
		pw.Close()
	}()
	url := readListenURL(t, pr)

	const key = "otel-secret-key-1234"
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, url+"/api/payments", strings.NewReader(`{"amountCents":100,"currency":"USD","reference":"otel"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		// A caller's trace is continued.
		req.Header.Set("Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST: %d", resp.StatusCode)
		}
	}
	cancel() // shutdown flushes both exporters
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("idem serve exited %d", code)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("idem serve did not stop")
	}

	traces, metrics := col.body("/v1/traces"), col.body("/v1/metrics")
	for _, want := range []string{"idem.outcome", "executed", "replayed", "idem-serve-test", "idem.operation",
		"idem.claim", "idem.complete", "idem.key_hash"} {
		if !bytes.Contains(traces, []byte(want)) {
			t.Errorf("the exported traces lack %q (%d bytes)", want, len(traces))
		}
	}
	// The trace ID of the caller's traceparent, in binary.
	if !bytes.Contains(traces, []byte{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6}) {
		t.Error("the server span does not continue the caller's trace")
	}
	for _, want := range []string{"idem.executions", "idem.replays", "idem.duration", "idem.store.duration"} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("the exported metrics lack %q (%d bytes)", want, len(metrics))
		}
	}
	if bytes.Contains(traces, []byte(key)) || bytes.Contains(metrics, []byte(key)) {
		t.Error("the key was exported")
	}
}

// readListenURL returns the URL idem serve logs when it listens.
func readListenURL(t *testing.T, r io.Reader) string {
	t.Helper()
	found := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`"url":"(http://[^"]+)"`)
		buf := make([]byte, 0, 4096)
		tmp := make([]byte, 1024)
		sent := false
		for {
			n, err := r.Read(tmp)
			buf = append(buf, tmp[:n]...)
			if m := re.FindSubmatch(buf); m != nil && !sent {
				found <- string(m[1])
				sent = true
			}
			if err != nil {
				return
			}
		}
	}()
	select {
	case u := <-found:
		return u
	case <-time.After(30 * time.Second):
		t.Fatal("idem serve did not start")
		return ""
	}
}

// TestProxyExportsOTLP runs idem proxy with OTEL_EXPORTER_OTLP_ENDPOINT set:
// its outcomes reach the collector as metrics and spans. (Not parallel: it
// sets the environment.)
func TestProxyExportsOTLP(t *testing.T) {
	col, endpoint := newCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
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
	url := readListenURL(t, pr)
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, url+"/payments", strings.NewReader(`{"a":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer client-a") // the proxy's default scope header
		req.Header.Set("Idempotency-Key", "proxy-otel-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST through the proxy: %d", resp.StatusCode)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("idem proxy exited %d", code)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("idem proxy did not stop")
	}
	traces, metrics := col.body("/v1/traces"), col.body("/v1/metrics")
	for _, want := range []string{"idem.claim", "idem.complete", "idem.key_hash", "idem-proxy"} {
		if !bytes.Contains(traces, []byte(want)) {
			t.Errorf("the exported traces lack %q", want)
		}
	}
	for _, want := range []string{"idem.executions", "idem.replays", "idem.store.duration"} {
		if !bytes.Contains(metrics, []byte(want)) {
			t.Errorf("the exported metrics lack %q", want)
		}
	}
	if bytes.Contains(traces, []byte("proxy-otel-key")) || bytes.Contains(metrics, []byte("proxy-otel-key")) {
		t.Error("the key was exported")
	}
}
