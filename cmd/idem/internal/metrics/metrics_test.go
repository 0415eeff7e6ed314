package metrics

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/idemhq/idem"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The children cached for known event kinds and status codes count as
// the vectors' own, values outside the cached range still count, and only
// the label values seen are exported.
func TestCachedChildren(t *testing.T) {
	t.Parallel()
	m := New()
	for _, k := range []idem.EventKind{idem.EventReplayed, idem.EventReplayed, idem.EventExecuted, 99, -1} {
		m.Observe(context.Background(), idem.Event{Kind: k})
	}
	for kind, want := range map[string]float64{"replayed": 2, "executed": 1, "unknown": 2} {
		if got := testutil.ToFloat64(m.outcomes.WithLabelValues(kind)); got != want {
			t.Errorf("idem_outcomes_total{kind=%q} = %v, want %v", kind, got, want)
		}
	}
	if n := testutil.CollectAndCount(m.outcomes); n != 3 {
		t.Errorf("%d outcome series, want 3 (the kinds observed)", n)
	}
	if n := testutil.CollectAndCount(m.idemDur); n != 3 {
		t.Errorf("%d duration series, want 3", n)
	}

	h := m.Instrument("POST /x", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.URL.Query().Get("code"))
		w.WriteHeader(code)
	}))
	for _, code := range []int{201, 201, 404, 700, 201} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/x?code="+strconv.Itoa(code), nil))
	}
	for code, want := range map[string]float64{"201": 3, "404": 1, "700": 1} {
		if got := testutil.ToFloat64(m.responses.WithLabelValues("POST /x", code)); got != want {
			t.Errorf("http_responses_total{code=%q} = %v, want %v", code, got, want)
		}
	}
	if n := testutil.CollectAndCount(m.responses); n != 3 {
		t.Errorf("%d response series, want 3", n)
	}
}

// BenchmarkObserve measures one replay's metrics: its event and its
// response.
func BenchmarkObserve(b *testing.B) {
	m := New()
	h := m.Instrument("POST /x", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
	w, r := httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/x", nil)
	b.ReportAllocs()
	for b.Loop() {
		m.Observe(context.Background(), idem.Event{Kind: idem.EventReplayed})
		h.ServeHTTP(w, r)
	}
}
