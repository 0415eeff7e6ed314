package cli

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/events"
	"github.com/idemhq/idem/inbox"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// consumeMetrics are idem consume's counters on GET /metrics.
type consumeMetrics struct {
	reg      *prometheus.Registry
	booked   prometheus.Counter
	replayed prometheus.Counter
	refused  *prometheus.CounterVec
}

// The reasons of idem_consume_refused_total.
const (
	refusedInvalidEvent = "invalid_event" // ParsePaymentCreated refused the payload
	refusedReusedID     = "reused_id"     // the id was handled before with another payload
	refusedInvalidID    = "invalid_id"    // no message id, or not 1 to 255 printable ASCII bytes
)

func newConsumeMetrics() *consumeMetrics {
	m := &consumeMetrics{reg: prometheus.NewRegistry()}
	m.booked = prometheus.NewCounter(prometheus.CounterOpts{Name: "idem_consume_booked_total",
		Help: "Events booked into the ledger."})
	m.replayed = prometheus.NewCounter(prometheus.CounterOpts{Name: "idem_consume_replayed_total",
		Help: "Deliveries of events already booked, acknowledged without booking again."})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "idem_consume_refused_total",
		Help: "Deliveries refused without booking and not redelivered (terminated or rejected at the broker), by reason: invalid_event, reused_id, invalid_id."},
		[]string{"reason"})
	for _, r := range []string{refusedInvalidEvent, refusedReusedID, refusedInvalidID} {
		m.refused.WithLabelValues(r) // every reason shows, at 0
	}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.booked, m.replayed, m.refused)
	return m
}

// config returns the hooks that count what the consumer does.
func (m *consumeMetrics) config(start func(context.Context) (time.Time, error)) *events.ConsumeConfig {
	return &events.ConsumeConfig{
		OnHandled: func(ran bool) {
			if ran {
				m.booked.Inc()
			} else {
				m.replayed.Inc()
			}
		},
		OnDropped: func(_ inbox.Message, err error) {
			switch {
			case errors.Is(err, events.ErrInvalidEvent):
				m.refused.WithLabelValues(refusedInvalidEvent).Inc()
			case errors.Is(err, idem.ErrFingerprintMismatch):
				m.refused.WithLabelValues(refusedReusedID).Inc()
			default:
				m.refused.WithLabelValues(refusedInvalidID).Inc()
			}
		},
		StartFunc: start,
	}
}

func (m *consumeMetrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// consumerStart is where idem consume's durable JetStream consumer starts
// when it has to be created (on Kafka: where the consumer group starts on a
// partition it has no committed offset for): the whole stream for a ledger
// that has never booked (its first start), and otherwise the last half of
// the deduplication window (--ttl). A consumer re-created for a ledger that
// has booked before (the consumer was deleted, or the server lost its
// JetStream state) thus delivers again only messages whose inbox records
// still exist, with half the window as a margin for working through them;
// older messages are taken as booked.
func consumerStart(ledger *events.Ledger, ttl time.Duration) func(context.Context) (time.Time, error) {
	return func(ctx context.Context) (time.Time, error) {
		booked, err := ledger.Booked(ctx)
		if err != nil || !booked {
			return time.Time{}, err
		}
		return time.Now().Add(-ttl / 2), nil
	}
}
