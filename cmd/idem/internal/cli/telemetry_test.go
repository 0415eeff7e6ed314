package cli

import (
	"bytes"
	"context"
	"encoding/json"
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
		select {
		case c.seen <- r.URL.Path:
		default: // nobody counts
		}
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

// OTEL_METRIC_EXPORT_INTERVAL sets how often metrics are exported (it was
// a fixed 15 s), and the start line names where each signal goes and the
// interval. (Not parallel: it sets the environment.)
func TestServeHonoursMetricExportInterval(t *testing.T) {
	col, endpoint := newCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncBuffer
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--db", filepath.Join(t.TempDir(), "idem.db"),
			"--log-format", "json"}, io.Discard, io.MultiWriter(pw, &logs))
		pw.Close()
	}()
	readListenURL(t, pr)
	go func() { _, _ = io.Copy(io.Discard, pr) }()

	// Three metric exports well within the first 15 s: the interval is
	// the environment's.
	began := time.Now()
	timeout := time.NewTimer(10 * time.Second)
	defer timeout.Stop()
	for n := 0; n < 3; {
		select {
		case path := <-col.seen:
			if path == "/v1/metrics" {
				n++
			}
		case <-timeout.C:
			t.Fatalf("%d metric exports in 10 s with OTEL_METRIC_EXPORT_INTERVAL=200", n)
		}
	}
	t.Logf("three metric exports in %v", time.Since(began).Round(time.Millisecond))
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("idem serve exited %d", code)
		}
	case <-time.After(40 * time.Second):
		t.Fatal("idem serve did not stop")
	}
	var start map[string]any
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "exporting OpenTelemetry") {
			if err := json.Unmarshal([]byte(line), &start); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := map[string]any{"traces": endpoint + "/v1/traces", "metrics": endpoint + "/v1/metrics", "metric_interval": "200ms", "metric_timeout": "30s"}
	for k, v := range want {
		if start[k] != v {
			t.Errorf("start line: %s = %v, want %v (line: %v)", k, start[k], v, start)
		}
	}
}

func TestReadOTLPEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  map[string]string
		want otlpEnv
		err  string
	}{
		{"nothing set", nil, otlpEnv{interval: 15 * time.Second, timeout: 30 * time.Second}, ""},
		{"base endpoint", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"},
			otlpEnv{traces: "http://c:4318/v1/traces", metrics: "http://c:4318/v1/metrics", interval: 15 * time.Second, timeout: 30 * time.Second}, ""},
		{"per-signal endpoint only", map[string]string{"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "https://m:443/custom"},
			otlpEnv{metrics: "https://m:443/custom", interval: 15 * time.Second, timeout: 30 * time.Second}, ""},
		{"per-signal wins", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:1/x"},
			otlpEnv{traces: "http://t:1/x", metrics: "http://c:4318/v1/metrics", interval: 15 * time.Second, timeout: 30 * time.Second}, ""},
		{"interval and timeout", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_METRIC_EXPORT_INTERVAL": "5000", "OTEL_METRIC_EXPORT_TIMEOUT": "2500"},
			otlpEnv{traces: "http://c:4318/v1/traces", metrics: "http://c:4318/v1/metrics", interval: 5 * time.Second, timeout: 2500 * time.Millisecond}, ""},
		{"exporter none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"},
			otlpEnv{metrics: "http://c:4318/v1/metrics", interval: 15 * time.Second, timeout: 30 * time.Second}, ""},
		{"sdk disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"},
			otlpEnv{interval: 15 * time.Second, timeout: 30 * time.Second}, ""},
		{"credentials redacted", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://u:secret@c:4318"},
			otlpEnv{traces: "http://u:xxxxx@c:4318/v1/traces", metrics: "http://u:xxxxx@c:4318/v1/metrics", interval: 15 * time.Second, timeout: 30 * time.Second}, ""},
		{"interval in seconds", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_METRIC_EXPORT_INTERVAL": "5s"}, otlpEnv{}, "OTEL_METRIC_EXPORT_INTERVAL=5s: must be a positive whole number of milliseconds"},
		{"zero interval", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_METRIC_EXPORT_INTERVAL": "0"}, otlpEnv{}, "OTEL_METRIC_EXPORT_INTERVAL=0"},
		{"bad timeout", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_METRIC_EXPORT_TIMEOUT": "-1"}, otlpEnv{}, "OTEL_METRIC_EXPORT_TIMEOUT=-1"},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, otlpEnv{}, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"},
		{"console exporter", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_METRICS_EXPORTER": "console"}, otlpEnv{}, "OTEL_METRICS_EXPORTER=console"},
		{"endpoint without scheme", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, otlpEnv{}, "OTEL_EXPORTER_OTLP_ENDPOINT=collector:4318: not an http:// or https:// URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := readOTLPEnv(func(k string) string { return tc.env[k] })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("readOTLPEnv = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
