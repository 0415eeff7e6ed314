// Package idemotel reports idem's work through OpenTelemetry
// (go.opentelemetry.io/otel): metrics through the OTel metric API, and
// attributes and events on the request's span (the server span that
// otelhttp, otelgrpc or the framework's instrumentation started).
//
//	obs, err := idemotel.New(&idemotel.Config{Store: "postgres"})
//	...
//	mw, err := idem.NewMiddleware(store, &idem.Config{Observer: obs})
//
// Metrics (instrument names; every one carries idem.operation, and the
// store name as idem.store when Config.Store is set):
//
//	idem.executions     operations executed and stored
//	idem.replays        stored responses replayed
//	idem.conflicts      duplicates answered "in progress" (409, gRPC Aborted)
//	idem.mismatches     keys reused with another request (422)
//	idem.store.errors   store failures (503)
//	idem.releases       operations whose outcome was not stored (5xx, errors)
//	idem.rejections     requests refused before any claim (400, 413)
//	idem.outcomes       every outcome, by idem.outcome
//	idem.duration       seconds from a request reaching idem to its outcome
//	idem.store.duration seconds per store call, by idem.phase (claim,
//	                    complete, release)
//
// Spans: each phase of a request (idem.PhaseObserver) is a span, a child
// of the request's span: "idem.claim", "idem.execute" (the handler's own
// spans nest in it), "idem.complete" or "idem.release", and "idem.replay",
// with idem.operation, idem.key_hash (idem.RedactKey: a hash, never the
// key) and idem.store, and the error status when the phase failed. On the
// request's span: idem.outcome, idem.replayed, idem.operation and
// idem.key_hash, an "idem.<outcome>" event per outcome, and the error
// status for store failures and lost leases. Keys never appear: not in
// attributes, events or metric labels.
package idemotel

import (
	"context"
	"errors"
	"time"

	"github.com/idemhq/idem"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of idemotel's tracer and meter.
const ScopeName = "github.com/idemhq/idem/idemotel"

// Attribute keys.
const (
	AttrOperation = attribute.Key("idem.operation")
	AttrOutcome   = attribute.Key("idem.outcome")
	AttrReplayed  = attribute.Key("idem.replayed")
	AttrStore     = attribute.Key("idem.store")
	AttrTookOver  = attribute.Key("idem.took_over")
	AttrWaited    = attribute.Key("idem.waited")
	AttrCode      = attribute.Key("idem.code")
	AttrKeyHash   = attribute.Key("idem.key_hash")
	AttrPhase     = attribute.Key("idem.phase")
)

// Config configures an Observer. A nil *Config means all defaults.
type Config struct {
	// MeterProvider creates the instruments. Defaults to the global one
	// (otel.GetMeterProvider()).
	MeterProvider metric.MeterProvider

	// TracerProvider creates idem's phase spans. Defaults to the global
	// one (otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider

	// Store names the store in the idem.store attribute ("sqlite",
	// "postgres", "redis", ...). Defaults to none.
	Store string
}

// Observer is an idem.Observer that records metrics and annotates the
// request's span. It is safe for concurrent use.
type Observer struct {
	tracer trace.Tracer
	store  attribute.KeyValue
	hasSt  bool

	executions, replays, conflicts, mismatches, storeErrors, releases, rejections, outcomes metric.Int64Counter
	duration, storeDuration                                                                 metric.Float64Histogram
}

var _ idem.Observer = (*Observer)(nil)

// New returns an Observer whose instruments come from cfg's meter provider.
func New(cfg *Config) (*Observer, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	meter := c.MeterProvider.Meter(ScopeName)
	o := &Observer{tracer: c.TracerProvider.Tracer(ScopeName)}
	if c.Store != "" {
		o.store, o.hasSt = AttrStore.String(c.Store), true
	}
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		ctr, err := meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit("{request}"))
		errs = append(errs, err)
		return ctr
	}
	o.executions = counter("idem.executions", "Operations executed and stored.")
	o.replays = counter("idem.replays", "Stored responses replayed to retries.")
	o.conflicts = counter("idem.conflicts", "Duplicates answered while the first attempt was in flight.")
	o.mismatches = counter("idem.mismatches", "Keys reused with a different request.")
	o.storeErrors = counter("idem.store.errors", "Store failures.")
	o.releases = counter("idem.releases", "Operations whose outcome was not stored; their keys can be used again.")
	o.rejections = counter("idem.rejections", "Requests refused before any claim.")
	o.outcomes = counter("idem.outcomes", "Every outcome, by idem.outcome.")
	var err error
	o.duration, err = meter.Float64Histogram("idem.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a request reaching idem to its outcome."),
		metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
	errs = append(errs, err)
	o.storeDuration, err = meter.Float64Histogram("idem.store.duration", metric.WithUnit("s"),
		metric.WithDescription("Time of one store call, by idem.phase."),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// Observe implements idem.Observer.
func (o *Observer) Observe(ctx context.Context, e idem.Event) {
	outcome := e.Kind.String()
	attrs := make([]attribute.KeyValue, 0, 3)
	attrs = append(attrs, AttrOperation.String(e.Operation))
	if o.hasSt {
		attrs = append(attrs, o.store)
	}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	switch e.Kind {
	case idem.EventExecuted:
		o.executions.Add(ctx, 1, set)
	case idem.EventReplayed:
		o.replays.Add(ctx, 1, set)
	case idem.EventInFlight:
		o.conflicts.Add(ctx, 1, set)
	case idem.EventMismatch:
		o.mismatches.Add(ctx, 1, set)
	case idem.EventStoreError:
		o.storeErrors.Add(ctx, 1, set)
	case idem.EventReleased:
		o.releases.Add(ctx, 1, set)
	case idem.EventRejected:
		o.rejections.Add(ctx, 1, set)
	}
	if e.Kind != idem.EventRenewed {
		withOutcome := metric.WithAttributeSet(attribute.NewSet(append(attrs, AttrOutcome.String(outcome))...))
		o.outcomes.Add(ctx, 1, withOutcome)
		o.duration.Record(ctx, e.Duration.Seconds(), withOutcome)
	}

	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	evAttrs := []attribute.KeyValue{AttrOperation.String(e.Operation)}
	if e.Code != "" {
		evAttrs = append(evAttrs, AttrCode.String(e.Code))
	}
	if e.TookOver {
		evAttrs = append(evAttrs, AttrTookOver.Bool(true))
	}
	if e.Waited {
		evAttrs = append(evAttrs, AttrWaited.Bool(true))
	}
	span.AddEvent("idem."+outcome, trace.WithAttributes(evAttrs...))
	if e.Kind == idem.EventRenewed || (e.Kind == idem.EventStoreError && e.Status == 0) {
		return // not the request's outcome
	}
	span.SetAttributes(AttrOutcome.String(outcome), AttrReplayed.Bool(e.Kind == idem.EventReplayed), AttrOperation.String(e.Operation))
	if o.hasSt {
		span.SetAttributes(o.store)
	}
	switch e.Kind {
	case idem.EventStoreError, idem.EventLeaseLost:
		if e.Err != nil {
			span.RecordError(e.Err)
		}
		span.SetStatus(codes.Error, "idem: "+outcome)
	}
}

// StartPhase implements idem.PhaseObserver: the phase becomes a span, and a
// store call's duration is recorded in idem.store.duration.
func (o *Observer) StartPhase(ctx context.Context, ph idem.Phase, info idem.PhaseInfo) (context.Context, func(error)) {
	attrs := make([]attribute.KeyValue, 0, 3)
	attrs = append(attrs, AttrOperation.String(info.Operation), AttrKeyHash.String(info.KeyHash))
	if o.hasSt {
		attrs = append(attrs, o.store)
	}
	if ph == idem.PhaseClaim {
		// The request's span learns the key's hash as soon as it is known.
		if s := trace.SpanFromContext(ctx); s.IsRecording() {
			s.SetAttributes(AttrKeyHash.String(info.KeyHash))
		}
	}
	kind := trace.SpanKindInternal
	if ph != idem.PhaseExecute && ph != idem.PhaseReplay {
		kind = trace.SpanKindClient // a call to the store
	}
	ctx, span := o.tracer.Start(ctx, "idem."+ph.String(), trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
	started := time.Now()
	return ctx, func(err error) {
		if kind == trace.SpanKindClient {
			set := []attribute.KeyValue{AttrPhase.String(ph.String()), AttrOperation.String(info.Operation)}
			if o.hasSt {
				set = append(set, o.store)
			}
			o.storeDuration.Record(context.WithoutCancel(ctx), time.Since(started).Seconds(), metric.WithAttributes(set...))
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
}
