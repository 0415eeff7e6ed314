package proxy

import (
	"context"
	"crypto/rand"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
)

// The benchmarks compare, in one run and over loopback, a plain
// httputil.ReverseProxy with the idem proxy on the same upstream (a small
// JSON answer), for first executions (a new key per request) and replays
// (one key, executed once before timing), on each store. Each reports
// throughput (req/s) and latency percentiles measured at the client.
//
//	go test -run '^$' -bench BenchmarkProxy -benchtime 5s ./internal/proxy/

const benchBody = `{"amount":100,"currency":"EUR","customer":"cus_42"}`

var benchAnswer = []byte(`{"id":"pay_123","status":"succeeded","amount":100,"currency":"EUR"}`)

func benchUpstream(b *testing.B) *url.URL {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(benchAnswer)))
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(benchAnswer)
	}))
	b.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	return u
}

func benchTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 512
	t.MaxIdleConnsPerHost = 256
	t.DisableCompression = true
	return t
}

// plainProxy is the baseline: the standard library's reverse proxy with
// the same transport, forwarding headers and buffer pool.
func plainProxy(up *url.URL) http.Handler {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(up)
			pr.SetXForwarded()
		},
		Transport:  benchTransport(),
		BufferPool: bufferPool{},
	}
}

func BenchmarkProxy(b *testing.B) {
	up := benchUpstream(b)
	b.Run("plain", func(b *testing.B) {
		srv := httptest.NewServer(plainProxy(up))
		defer srv.Close()
		b.Run("post", func(b *testing.B) { runLoad(b, srv.URL, http.MethodPost, func(int64) string { return "k" }) })
		b.Run("get", func(b *testing.B) { runLoad(b, srv.URL, http.MethodGet, nil) })
	})
	for _, st := range benchStores {
		b.Run(st.name, func(b *testing.B) {
			srv := benchProxyServer(b, up, st.spec(b))
			run := rand.Text()[:10]
			b.Run("first", func(b *testing.B) {
				// Sub-benchmarks run several times with growing b.N; the
				// prefix keeps every round's keys new.
				prefix := run + "-" + rand.Text()[:6] + "-"
				runLoad(b, srv.URL, http.MethodPost, func(i int64) string { return prefix + strconv.FormatInt(i, 10) })
			})
			b.Run("replay", func(b *testing.B) {
				key := run + "-replayed"
				r, err := benchSend(srv.URL, http.MethodPost, key)
				if err != nil || r != http.StatusCreated {
					b.Fatalf("warm-up: %d %v", r, err)
				}
				runLoad(b, srv.URL, http.MethodPost, func(int64) string { return key })
			})
			if st.name == "memory" {
				// Requests that need no key pass through; the store is
				// not involved.
				b.Run("get", func(b *testing.B) { runLoad(b, srv.URL, http.MethodGet, nil) })
			}
		})
	}
}

// benchStores are the records stores the proxy benchmarks run on, each
// spec made for one benchmark.
var benchStores = []struct {
	name string
	spec func(b *testing.B) string
}{
	{"memory", func(*testing.B) string { return "memory" }},
	{"redis", func(b *testing.B) string { return redisSpec(b) }},
	{"sqlite", func(b *testing.B) string { return filepath.Join(b.TempDir(), "records.db") }},
	{"postgres", func(b *testing.B) string { return postgresSpec(b) }},
}

// benchProxyServer serves an idem proxy in front of up with its records in
// the store spec names; both close when b ends.
func benchProxyServer(b *testing.B, up *url.URL, spec string) *httptest.Server {
	b.Helper()
	store, err := backend.Open(context.Background(), spec)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { store.Close() })
	p, err := New(&Config{Upstream: up, Store: store.Records, Transport: benchTransport(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewServer(p)
	b.Cleanup(srv.Close)
	return srv
}

var benchClient = &http.Client{Transport: benchTransport()}

// benchSend sends a POST with a key, or a GET without a body and key.
func benchSend(target, method, key string) (int, error) {
	var body io.Reader
	if method != http.MethodGet {
		body = strings.NewReader(benchBody)
	}
	req, _ := http.NewRequest(method, target+"/payments", body)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(idem.HeaderKey, key)
	}
	req.Header.Set("Authorization", "Bearer bench-client")
	resp, err := benchClient.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// runLoad sends requests from 16 concurrent clients (8 per CPU on this
// machine) and reports req/s and client-side latency percentiles. key
// names the key of the i-th request (nil: no key).
func runLoad(b *testing.B, target, method string, key func(i int64) string) {
	var seq atomic.Int64
	var mu sync.Mutex
	var all []time.Duration
	b.SetParallelism(8)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		lat := make([]time.Duration, 0, 1024)
		for pb.Next() {
			t0 := time.Now()
			k := ""
			if key != nil {
				k = key(seq.Add(1))
			}
			status, err := benchSend(target, method, k)
			if err != nil || status != http.StatusCreated {
				b.Errorf("status %d, %v", status, err)
				return
			}
			lat = append(lat, time.Since(t0))
		}
		mu.Lock()
		all = append(all, lat...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	pct := func(p float64) float64 {
		return float64(all[min(len(all)-1, int(p*float64(len(all))))].Microseconds())
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "req/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.90), "p90-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// BenchmarkProxyPaired measures the plain proxy, first executions and
// replays in alternating slices of 100 ms each (one round = one slice of
// each), so that the load of other work on the machine falls on all three
// alike; the ratios it reports are the comparison to read. Each round is
// one b.N iteration.
//
//	go test -run '^$' -bench BenchmarkProxyPaired -benchtime 40x ./internal/proxy/
func BenchmarkProxyPaired(b *testing.B) {
	up := benchUpstream(b)
	plain := httptest.NewServer(plainProxy(up))
	defer plain.Close()
	for _, st := range benchStores {
		b.Run(st.name, func(b *testing.B) {
			srv := benchProxyServer(b, up, st.spec(b))
			prefix := rand.Text()[:12] + "-"
			replayKey := prefix + "replayed"
			if s, err := benchSend(srv.URL, http.MethodPost, replayKey); err != nil || s != http.StatusCreated {
				b.Fatalf("warm-up: %d %v", s, err)
			}
			var seq atomic.Int64
			systems := []struct {
				name   string
				target string
				key    func() string
				lat    []time.Duration
				total  time.Duration
			}{
				{name: "plain", target: plain.URL, key: func() string { return "k" }},
				{name: "first", target: srv.URL, key: func() string { return prefix + strconv.FormatInt(seq.Add(1), 10) }},
				{name: "replay", target: srv.URL, key: func() string { return replayKey }},
			}
			b.ResetTimer()
			for range b.N {
				for i := range systems {
					s := &systems[i]
					lat, d := loadSlice(b, s.target, s.key, 100*time.Millisecond)
					s.lat = append(s.lat, lat...)
					s.total += d
				}
			}
			b.StopTimer()
			rps := map[string]float64{}
			for i := range systems {
				s := &systems[i]
				if len(s.lat) == 0 {
					b.Fatalf("%s: no request completed", s.name)
				}
				slices.Sort(s.lat)
				rps[s.name] = float64(len(s.lat)) / s.total.Seconds()
				b.ReportMetric(rps[s.name], s.name+"-req/s")
				b.ReportMetric(float64(s.lat[len(s.lat)/2].Microseconds()), s.name+"-p50-µs")
				b.ReportMetric(float64(s.lat[min(len(s.lat)-1, len(s.lat)*99/100)].Microseconds()), s.name+"-p99-µs")
			}
			b.ReportMetric(rps["first"]/rps["plain"], "first/plain")
			b.ReportMetric(rps["replay"]/rps["plain"], "replay/plain")
		})
	}
}

// loadSlice posts from 16 concurrent clients for d and returns every
// request's latency and the slice's real duration.
func loadSlice(b *testing.B, target string, key func() string, d time.Duration) ([]time.Duration, time.Duration) {
	const clients = 16
	var wg sync.WaitGroup
	lats := make([][]time.Duration, clients)
	start := time.Now()
	end := start.Add(d)
	for c := range clients {
		wg.Go(func() {
			for time.Now().Before(end) {
				t0 := time.Now()
				status, err := benchSend(target, http.MethodPost, key())
				if err != nil || status != http.StatusCreated {
					b.Errorf("status %d, %v", status, err)
					return
				}
				lats[c] = append(lats[c], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	var all []time.Duration
	for _, l := range lats {
		all = append(all, l...)
	}
	return all, elapsed
}
