// Package metrics exposes idem's outcomes and HTTP latencies in the
// Prometheus text format, through an idem.Observer: the core never imports
// a metrics client.
package metrics

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemhq/idem"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics is a Prometheus registry with idem's collectors.
type Metrics struct {
	reg *prometheus.Registry

	outcomes  *prometheus.CounterVec
	responses *prometheus.CounterVec
	idemDur   *prometheus.HistogramVec
	httpDur   *prometheus.HistogramVec
	running   prometheus.Gauge

	executions, replays, rejected400, conflicts409, mismatches422, unavailable503, leaseLost prometheus.Counter

	// kinds holds each event kind's children (seriesOf).
	kinds [maxKinds]atomic.Pointer[kindSeries]

	// rates is the recent history of the main outcomes, for the console.
	rates rates
	// now is the clock of the history. Defaults to time.Now.
	now func() time.Time
}

// New returns a registry with the idem collectors and the Go runtime and
// process collectors.
func New() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry(), now: time.Now}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
		m.reg.MustRegister(c)
		return c
	}
	m.executions = counter("idem_executions_total", "Operations executed and stored.")
	m.replays = counter("idem_replays_total", "Stored responses replayed to retries.")
	m.rejected400 = counter("idem_bad_requests_total", "Requests refused with 400 before any claim (missing or invalid key, invalid body).")
	m.conflicts409 = counter("idem_conflicts_total", "Duplicates answered 409 while the first attempt was in flight.")
	m.mismatches422 = counter("idem_key_reused_total", "Keys reused with a different request, answered 422.")
	m.unavailable503 = counter("idem_store_unavailable_total", "Requests answered 503 because the store failed.")
	m.leaseLost = counter("idem_lease_lost_total", "Executions whose lease was lost; their results were discarded.")
	m.outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_outcomes_total", Help: "Every idem outcome, by kind.",
	}, []string{"kind"})
	m.responses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "http_responses_total", Help: "HTTP responses by route and status code.",
	}, []string{"route", "code"})
	m.idemDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "idem_duration_seconds", Help: "Time from a request reaching idem to its outcome, by kind.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14),
	}, []string{"kind"})
	m.httpDur = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "http_request_duration_seconds", Help: "HTTP request latency by route.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14),
	}, []string{"route"})
	m.running = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "idem_operations_in_flight", Help: "Operations running now (handlers executing under a claim).",
	})
	m.reg.MustRegister(m.outcomes, m.responses, m.idemDur, m.httpDur, m.running)
	return m
}

// InFlight counts the executions of next that are running. Wrap the
// handler inside the idem middleware: it then runs only under a claim.
func (m *Metrics) InFlight(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.running.Inc()
		defer m.running.Dec()
		next.ServeHTTP(w, r)
	})
}

// maxKinds bounds the event kinds whose children are cached (kinds):
// every kind the core defines today is below it.
const maxKinds = 32

// kindSeries are the children of outcomes and idemDur for one event kind.
type kindSeries struct {
	outcome prometheus.Counter
	dur     prometheus.Observer
}

// seriesOf returns the children of kind k. A request then does not pay
// WithLabelValues' hashing and map look-ups (about 1.5k instructions each
// on a replay). They are resolved on the kind's first event, so the
// exported series are those without the cache. A kind outside the cache's
// range is resolved on every event, as before.
func (m *Metrics) seriesOf(k idem.EventKind) kindSeries {
	cached := k >= 0 && k < maxKinds
	if cached {
		if s := m.kinds[k].Load(); s != nil {
			return *s
		}
	}
	kind := k.String()
	s := kindSeries{m.outcomes.WithLabelValues(kind), m.idemDur.WithLabelValues(kind)}
	if cached {
		// Two first events at once both store; the vectors gave them
		// the same children.
		m.kinds[k].Store(&s)
	}
	return s
}

// Observe implements idem.Observer.
func (m *Metrics) Observe(_ context.Context, e idem.Event) {
	series := m.seriesOf(e.Kind)
	series.outcome.Inc()
	if e.Kind != idem.EventRenewed {
		series.dur.Observe(e.Duration.Seconds())
	}
	switch e.Kind {
	case idem.EventExecuted:
		m.executions.Inc()
		m.rates.add(RateExecutions, m.now())
	case idem.EventReplayed:
		m.replays.Inc()
		m.rates.add(RateReplays, m.now())
	case idem.EventInFlight:
		m.conflicts409.Inc()
		m.rates.add(RateConflicts, m.now())
	case idem.EventMismatch:
		m.mismatches422.Inc()
		m.rates.add(RateMismatches, m.now())
	case idem.EventLeaseLost:
		m.leaseLost.Inc()
	case idem.EventRejected:
		if e.Status == http.StatusBadRequest {
			m.rejected400.Inc()
		}
	case idem.EventStoreError:
		if e.Status == http.StatusServiceUnavailable {
			m.unavailable503.Inc()
		}
		m.rates.add(RateStoreErrors, m.now())
	}
}

// Handler serves the registry at /metrics.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Instrument counts next's responses by status and times them under the
// given route label (a fixed pattern, never the raw path, to keep label
// values bounded).
func (m *Metrics) Instrument(route string, next http.Handler) http.Handler {
	dur := m.httpDur.WithLabelValues(route)
	// codes caches the route's response counters by status code, as
	// seriesOf caches the kinds'.
	var codes [500]atomic.Pointer[prometheus.Counter]
	response := func(code int) prometheus.Counter {
		cached := code >= 100 && code < 100+len(codes)
		if cached {
			if c := codes[code-100].Load(); c != nil {
				return *c
			}
		}
		c := m.responses.WithLabelValues(route, strconv.Itoa(code))
		if cached {
			codes[code-100].Store(&c)
		}
		return c
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &StatusWriter{ResponseWriter: w}
		defer func() { // also for handlers that abort
			dur.Observe(time.Since(start).Seconds())
			response(sw.Status()).Inc()
		}()
		next.ServeHTTP(sw, r)
	})
}

// StatusWriter records the status code a handler sent.
type StatusWriter struct {
	http.ResponseWriter
	status int
	Bytes  int64
}

// WriteHeader records the status.
func (w *StatusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write counts the bytes written.
func (w *StatusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	n, err := w.ResponseWriter.Write(p)
	w.Bytes += int64(n)
	return n, err
}

// Status returns the status sent (200 if the handler wrote nothing).
func (w *StatusWriter) Status() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *StatusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush passes flushes through.
func (w *StatusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Register adds collectors of other parts of the process (the events
// dispatcher) to the registry.
func (m *Metrics) Register(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := m.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
