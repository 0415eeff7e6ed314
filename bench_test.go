package idem_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
)

// A 100-byte JSON body, as the core's performance targets specify.
var benchBody = []byte(`{"amountCents":2599,"currency":"USD","reference":"order-1001","customer":"cus_8e03978e40d5","x":123}`)

// discardWriter is a ResponseWriter that keeps nothing, so benchmarks
// measure the handler chain and not a recorder.
type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }

func benchHandler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write([]byte(`{"id":"pay_123","amountCents":2599,"currency":"USD","bytes":`))
	w.Write(strconv.AppendInt(nil, int64(len(body)), 10))
	w.Write([]byte("}"))
}

// BenchmarkMiddleware compares the bare handler with the middleware on
// memstore for the three paths of docs/BENCHMARKS.md. The overhead of a
// path is its ns/op minus bare's.
func BenchmarkMiddleware(b *testing.B) {
	if len(benchBody) != 100 {
		b.Fatalf("body is %d bytes, want 100", len(benchBody))
	}
	store, err := memstore.New(&memstore.Config{MaxRecords: 1 << 26})
	if err != nil {
		b.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, nil)
	if err != nil {
		b.Fatal(err)
	}
	bare := http.HandlerFunc(benchHandler)
	wrapped := mw.Handle(bare)

	run := func(b *testing.B, h http.Handler, key func(i int) string) {
		b.ReportAllocs()
		req, _ := http.NewRequest(http.MethodPost, "http://example.com/api/payments", nil)
		req.Header.Set("Content-Type", "application/json")
		req.Pattern = "POST /api/payments" // as a ServeMux route sets it
		w := &discardWriter{h: make(http.Header)}
		rd := bytes.NewReader(benchBody)
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			rd.Reset(benchBody)
			req.Body = io.NopCloser(rd)
			req.ContentLength = int64(len(benchBody))
			if key != nil {
				req.Header["Idempotency-Key"] = []string{key(i)}
			}
			clear(w.h)
			h.ServeHTTP(w, req)
			if w.status != http.StatusCreated {
				b.Fatalf("status %d", w.status)
			}
		}
	}
	// Unique keys are made as a real server receives them: one new string
	// per request.
	optional, err := idem.NewMiddleware(store, &idem.Config{Requirement: idem.KeyOptional})
	if err != nil {
		b.Fatal(err)
	}

	b.Run("bare", func(b *testing.B) { run(b, bare, nil) })
	b.Run("nokey", func(b *testing.B) { run(b, optional.Handle(bare), nil) })
	// The first-execution path runs in a steady state, as a service does
	// once its TTL has passed: a virtual clock moves 1 ms per request, the
	// TTL is 64 s, and expired records are deleted in batches every 16,384
	// requests (inside the timed loop). The store thus holds about 64k
	// records instead of growing without bound, which would measure the
	// heap's growth rather than the middleware.
	var now atomic.Int64
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	steady, _ := memstore.New(&memstore.Config{MaxRecords: 1 << 20})
	firstMW, err := idem.NewMiddleware(steady, &idem.Config{TTL: 64 * time.Second, NowFunc: clock})
	if err != nil {
		b.Fatal(err)
	}
	firstH := firstMW.Handle(bare)
	newKey := steadyKeys(steady, &now, "first", 1<<14)
	firstKey := func(int) string { return newKey() }
	// Reach the steady state (a full TTL of records) before measuring.
	w := &discardWriter{h: make(http.Header)}
	for i := range 80_000 {
		req, _ := http.NewRequest(http.MethodPost, "http://example.com/api/payments", bytes.NewReader(benchBody))
		req.Pattern = "POST /api/payments"
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", firstKey(i))
		clear(w.h)
		firstH.ServeHTTP(w, req)
	}
	b.Run("first", func(b *testing.B) {
		run(b, firstH, firstKey)
	})
	b.Run("replay", func(b *testing.B) {
		run(b, wrapped, func(int) string { return `"replay-8e03978e-40d5-43e8-bc93-6894a57f9324"` })
	})
}

// BenchmarkGrownStore measures the middleware's overhead the way issue 14
// compares Go idempotency middlewares: memstore grown to about 150,000
// live keys (as in a process that has run for a while), a fresh
// httptest.ResponseRecorder per request, and the bare handler as the
// baseline. Overhead = first's or replay's ns/op minus bare's. The store
// stays near 150k keys during "first": a virtual clock moves 1 ms per
// request, the TTL is 150 s and expired records are deleted in batches
// inside the timed loop.
func BenchmarkGrownStore(b *testing.B) {
	const live = 150_000
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	store, err := memstore.New(&memstore.Config{MaxRecords: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, &idem.Config{TTL: live * time.Millisecond, NowFunc: clock})
	if err != nil {
		b.Fatal(err)
	}
	bare := http.HandlerFunc(benchHandler)
	wrapped := mw.Handle(bare)
	newKey := steadyKeys(store, &now, "grown", 1<<14)
	serve := func(h http.Handler, key string) int {
		req := httptest.NewRequest(http.MethodPost, "http://example.com/api/payments", bytes.NewReader(benchBody))
		req.Header.Set("Content-Type", "application/json")
		req.Pattern = "POST /api/payments"
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	for range live {
		if code := serve(wrapped, newKey()); code != http.StatusCreated {
			b.Fatalf("warm-up: status %d", code)
		}
	}
	const replayKey = `"grown-replay-8e03978e-40d5-43e8-bc93"`
	run := func(b *testing.B, h http.Handler, key func() string) {
		b.ReportAllocs()
		for b.Loop() {
			k := ""
			if key != nil {
				k = key()
			}
			if code := serve(h, k); code != http.StatusCreated {
				b.Fatalf("status %d", code)
			}
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, bare, nil) })
	b.Run("first", func(b *testing.B) { run(b, wrapped, newKey) })
	b.Run("replay", func(b *testing.B) { run(b, wrapped, func() string { return replayKey }) })
}

// steadyKeys returns a generator of new keys for a first-execution
// benchmark on store, made as a real server receives them (one new string
// per request). Each key moves now by 1 ms, and every `every` keys the
// expired records are deleted in batches (inside the timed loop), so that
// the store stays at one TTL's worth of records instead of measuring the
// heap's growth.
func steadyKeys(store *memstore.Store, now *atomic.Int64, prefix string, every int) func() string {
	next := 0
	buf := []byte(`"` + prefix + `-`)
	n0 := len(buf)
	return func() string {
		next++
		if next%every == 0 {
			for {
				n, _ := store.DeleteExpired(context.Background(), idemstore.DeleteExpiredParams{Limit: 1 << 12, Now: time.Unix(0, now.Load())})
				if n < 1<<12 {
					break
				}
			}
		}
		now.Add(int64(time.Millisecond))
		k := strconv.AppendInt(buf[:n0], int64(next), 10)
		return string(append(k, `-8e03978e-40d5-43e8-bc93"`...))
	}
}
