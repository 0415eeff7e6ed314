package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Provider holds the metrics of idem serve's provider mode: the charges
// sent to the provider and the reconciler's work. It implements
// payments.ChargeObserver.
type Provider struct {
	attempts  *prometheus.CounterVec
	retries   prometheus.Counter
	outcomes  *prometheus.CounterVec
	reconcile *prometheus.CounterVec
	passes    prometheus.Counter
	held      prometheus.Gauge
}

// Provider registers the provider mode's metrics, all labelled by a fixed
// set of values:
//
//   - idem_provider_charge_attempts_total{answer}: every HTTP attempt at
//     the provider, by what its answer meant (created, declined,
//     retryable, unexpected, refused, lost);
//   - idem_provider_charge_retries_total: the attempts that were followed
//     by another one with the same key;
//   - idem_provider_charge_outcomes_total{outcome}: how each provider step
//     ended (captured, declined, unknown, incomplete, error);
//   - idem_reconcile_operations_total{result}: the payments the
//     reconciler resumed, by result (completed, failed, held);
//   - idem_reconcile_passes_total: the reconciler's passes;
//   - idem_reconcile_held: the payments held for an operator, as the
//     last reconciliation pass counted them.
//
// answers and outcomes are the label values to report from the start, at
// zero.
func (m *Metrics) Provider(answers, outcomes []string) *Provider {
	p := &Provider{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_provider_charge_attempts_total",
			Help: "HTTP attempts at the card provider, by what the answer meant.",
		}, []string{"answer"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idem_provider_charge_retries_total",
			Help: "Provider attempts followed by another attempt with the same key.",
		}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_provider_charge_outcomes_total",
			Help: "Provider steps by how they ended.",
		}, []string{"outcome"}),
		reconcile: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_reconcile_operations_total",
			Help: "Pending payments the reconciler resumed, by result.",
		}, []string{"result"}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idem_reconcile_passes_total",
			Help: "Passes of the reconciler over the pending payments.",
		}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idem_reconcile_held",
			Help: "Payments held for an operator: reconciliation gave up on them (idem ls shows them as held).",
		}),
	}
	m.reg.MustRegister(p.attempts, p.retries, p.outcomes, p.reconcile, p.passes, p.held)
	for _, a := range answers {
		p.attempts.WithLabelValues(a)
	}
	for _, o := range outcomes {
		p.outcomes.WithLabelValues(o)
	}
	for _, r := range []string{"completed", "failed", "held"} {
		p.reconcile.WithLabelValues(r)
	}
	return p
}

// ChargeAttempt implements payments.ChargeObserver.
func (p *Provider) ChargeAttempt(answer string, retry bool) {
	p.attempts.WithLabelValues(answer).Inc()
	if retry {
		p.retries.Inc()
	}
}

// ChargeOutcome implements payments.ChargeObserver.
func (p *Provider) ChargeOutcome(outcome string) {
	p.outcomes.WithLabelValues(outcome).Inc()
}

// Reconciled counts one reconciliation pass's results: payments completed,
// resumed in vain (still reconciled), and resumed in vain and now held.
func (p *Provider) Reconciled(completed, failed, held int) {
	p.passes.Inc()
	p.reconcile.WithLabelValues("completed").Add(float64(completed))
	p.reconcile.WithLabelValues("failed").Add(float64(failed))
	p.reconcile.WithLabelValues("held").Add(float64(held))
}

// SetHeld sets the number of payments held for an operator.
func (p *Provider) SetHeld(n int) {
	p.held.Set(float64(n))
}
