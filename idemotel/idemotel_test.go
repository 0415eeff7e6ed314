package idemotel_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemotel"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// bundle is a real HTTP server whose requests run in server spans (as
// otelhttp would start them), behind idem with an idemotel Observer that
// exports to in-memory readers.
type bundle struct {
	url     string
	reader  *sdkmetric.ManualReader
	spans   *tracetest.SpanRecorder
	hold    chan struct{}
	entered chan struct{}
	down    atomic.Bool
}

// failing makes every claim fail, as an unreachable store does, while
// bundle.down is set.
type failing struct {
	idemstore.Store
	b *bundle
}

func (f failing) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	if f.b.down.Load() {
		return idemstore.ClaimResult{}, errors.New("connection refused")
	}
	return f.Store.Claim(ctx, p)
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder(),
		hold: make(chan struct{}), entered: make(chan struct{}, 1)}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(b.reader))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b.spans))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()); _ = tp.Shutdown(context.Background()) })
	obs, err := idemotel.New(&idemotel.Config{MeterProvider: mp, TracerProvider: tp, Store: "memory"})
	if err != nil {
		t.Fatal(err)
	}
	ms, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idem.NewMiddleware(failing{ms, b}, &idem.Config{Observer: obs, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.RawQuery, "hold") {
			b.entered <- struct{}{}
			<-b.hold
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":1}`)
	})))
	tracer := tp.Tracer("test")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tracer.Start(r.Context(), r.Method+" "+r.URL.Path, trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		mux.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(srv.Close)
	b.url = srv.URL
	return b
}

func (b *bundle) post(t *testing.T, query, key, body string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.url+"/orders"+query, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

const secretKey = "customer-4242-order-17"

func TestMetricsAndServerSpans(t *testing.T) {
	b := setup(t)
	statuses := []int{
		b.post(t, "", secretKey, `{"a":1}`), // executed
		b.post(t, "", secretKey, `{"a":1}`), // replayed
		b.post(t, "", secretKey, `{"a":2}`), // mismatch
		b.post(t, "", "", `{"a":1}`),        // rejected: no key
	}
	// In flight: hold one execution while a duplicate arrives.
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, b.url+"/orders?hold", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", "slow")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	select {
	case <-b.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the held request never reached the handler")
	}
	statuses = append(statuses, b.post(t, "?hold", "slow", `{}`)) // in flight
	close(b.hold)
	statuses = append(statuses, <-done)
	b.down.Store(true)
	statuses = append(statuses, b.post(t, "", "other", `{}`)) // store error
	want := []int{201, 201, 422, 400, 409, 201, 503}
	for i := range want {
		if statuses[i] != want[i] {
			t.Fatalf("statuses %v, want %v", statuses, want)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := b.reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	sums := map[string]int64{}
	var durations uint64
	storeCalls := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != idemotel.ScopeName {
			t.Errorf("instrumentation scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					sums[m.Name] += dp.Value
					checkAttrs(t, m.Name, dp.Attributes)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					checkAttrs(t, m.Name, dp.Attributes)
					if m.Name == "idem.duration" {
						durations += dp.Count
						continue
					}
					ph, _ := dp.Attributes.Value(idemotel.AttrPhase)
					storeCalls[ph.AsString()] += dp.Count
				}
			}
		}
	}
	for name, n := range map[string]int64{"idem.executions": 2, "idem.replays": 1, "idem.mismatches": 1, "idem.conflicts": 1,
		"idem.store.errors": 1, "idem.rejections": 1, "idem.outcomes": 7} {
		if sums[name] != n {
			t.Errorf("%s = %d, want %d (all: %v)", name, sums[name], n, sums)
		}
	}
	if durations != 7 {
		t.Errorf("idem.duration has %d observations, want 7", durations)
	}
	// Claims: 6 requests with a key; completions: 2; no release.
	if storeCalls["claim"] != 6 || storeCalls["complete"] != 2 || storeCalls["release"] != 0 {
		t.Errorf("idem.store.duration observations by phase: %v", storeCalls)
	}

	// Each server span carries its outcome and its phases as children;
	// none carries the key, only its hash.
	outcomes := map[string]int{}
	children := map[trace.SpanID][]string{}
	phaseErrors := map[string]int{}
	for _, s := range b.spans.Ended() {
		if s.SpanKind() != trace.SpanKindServer {
			children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s.Name())
			if s.Status().Code == codes.Error {
				phaseErrors[s.Name()]++
			}
			attrs := attribute.NewSet(s.Attributes()...)
			if h, _ := attrs.Value(idemotel.AttrKeyHash); !strings.HasPrefix(h.AsString(), "sha256:") {
				t.Errorf("phase span %s: idem.key_hash = %q", s.Name(), h.AsString())
			}
			continue
		}
		attrs := attribute.NewSet(s.Attributes()...)
		v, _ := attrs.Value(idemotel.AttrOutcome)
		outcomes[v.AsString()]++
		if v.AsString() == "replayed" {
			if r, _ := attrs.Value(idemotel.AttrReplayed); !r.AsBool() {
				t.Error("replayed span without idem.replayed=true")
			}
		}
		wantPhases := map[string]string{"executed": "idem.claim idem.execute idem.complete", "replayed": "idem.claim idem.replay",
			"mismatch": "idem.claim", "in_flight": "idem.claim", "store_error": "idem.claim", "rejected": ""}[v.AsString()]
		if got := strings.Join(children[s.SpanContext().SpanID()], " "); got != wantPhases {
			t.Errorf("%s request: phase spans %q, want %q", v.AsString(), got, wantPhases)
		}
		if h, _ := attrs.Value(idemotel.AttrKeyHash); v.AsString() == "executed" && h.AsString() != idem.RedactKey(secretKey) &&
			h.AsString() != idem.RedactKey("slow") {
			t.Errorf("server span idem.key_hash = %q", h.AsString())
		}
		if v.AsString() == "store_error" && s.Status().Code != codes.Error {
			t.Errorf("store error span status %v", s.Status())
		}
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), secretKey) {
				t.Errorf("span attribute %s holds the key", kv.Key)
			}
		}
		for _, ev := range s.Events() {
			for _, kv := range ev.Attributes {
				if strings.Contains(kv.Value.String(), secretKey) {
					t.Errorf("span event %s holds the key", ev.Name)
				}
			}
		}
	}
	if phaseErrors["idem.claim"] != 1 || len(phaseErrors) != 1 {
		t.Errorf("phase spans with an error status: %v, want one failed claim", phaseErrors)
	}
	for k, n := range map[string]int{"executed": 2, "replayed": 1, "mismatch": 1, "in_flight": 1, "rejected": 1, "store_error": 1} {
		if outcomes[k] != n {
			t.Errorf("%d server spans with idem.outcome=%s, want %d (all: %v)", outcomes[k], k, n, outcomes)
		}
	}
}

func checkAttrs(t *testing.T, name string, set attribute.Set) {
	t.Helper()
	if op, ok := set.Value(idemotel.AttrOperation); !ok || op.AsString() != "POST /orders" {
		t.Errorf("%s: idem.operation = %v", name, op)
	}
	if st, ok := set.Value(idemotel.AttrStore); !ok || st.AsString() != "memory" {
		t.Errorf("%s: idem.store = %v", name, st)
	}
	for _, kv := range set.ToSlice() {
		if strings.Contains(kv.Value.String(), secretKey) {
			t.Errorf("%s: attribute %s holds the key", name, kv.Key)
		}
	}
}
