package cli

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemotel"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// telemetry is OpenTelemetry export for idem serve and idem proxy: traces
// and metrics over OTLP/HTTP when the standard OTEL_EXPORTER_OTLP_ENDPOINT
// (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / _METRICS_ENDPOINT) variable is
// set, configured by the standard OTEL_* variables (headers, timeout,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, ...). The zero value is off:
// it wraps nothing and adds no observer.
type telemetry struct {
	obs      *idemotel.Observer
	shutdown func(context.Context) error
}

// otlpConfigured reports whether the environment asks for OTLP export.
func otlpConfigured() bool {
	for _, v := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"} {
		if os.Getenv(v) != "" {
			return true
		}
	}
	return false
}

// startTelemetry sets up OTLP export if the environment asks for it. The
// exporters connect lazily: a collector that is down costs dropped
// telemetry, never a failed start or a slow request.
func startTelemetry(ctx context.Context, service, store string, logger *slog.Logger) (*telemetry, error) {
	if !otlpConfigured() {
		return &telemetry{}, nil
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, err
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default
	// service name.
	if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	}
	traceExp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, err
	}
	metricExp, err := otlpmetrichttp.New(ctx)
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(traceExp), sdktrace.WithResource(res))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res),
		sdkmetric.WithReader(sdkmetric.NewPeriodicReader(metricExp, sdkmetric.WithInterval(15*time.Second))))
	otel.SetTracerProvider(tp)
	otel.SetMeterProvider(mp)
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("OpenTelemetry export failed", "error", err)
	}))
	obs, err := idemotel.New(&idemotel.Config{MeterProvider: mp, TracerProvider: tp, Store: store})
	if err != nil {
		return nil, err
	}
	logger.Info("exporting OpenTelemetry traces and metrics over OTLP/HTTP")
	return &telemetry{obs: obs, shutdown: func(ctx context.Context) error {
		return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx))
	}}, nil
}

// observer returns o (which may be nil), and the OpenTelemetry observer too
// when export is on.
func (t *telemetry) observer(o idem.Observer) idem.Observer {
	switch {
	case t.obs == nil:
		return o
	case o == nil:
		return t.obs
	}
	return observers{o, t.obs}
}

// handler wraps h so that each request runs in a server span (continuing
// the caller's trace from its traceparent field) when export is on.
func (t *telemetry) handler(h http.Handler, name string) http.Handler {
	if t.obs == nil {
		return h
	}
	return otelhttp.NewHandler(h, name)
}

// close flushes and stops the exporters, waiting at most 5 seconds.
func (t *telemetry) close(logger *slog.Logger) {
	if t.shutdown == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := t.shutdown(ctx); err != nil {
		logger.Warn("OpenTelemetry shutdown", "error", err)
	}
}

// observers tells every observer about each event, and hands phases to the
// first that traces them (idem.PhaseObserver), so that combining observers
// keeps the phase spans.
type observers []idem.Observer

func (os observers) Observe(ctx context.Context, e idem.Event) {
	for _, o := range os {
		o.Observe(ctx, e)
	}
}

// StartPhase implements idem.PhaseObserver.
func (os observers) StartPhase(ctx context.Context, ph idem.Phase, info idem.PhaseInfo) (context.Context, func(error)) {
	for _, o := range os {
		if po, ok := o.(idem.PhaseObserver); ok {
			return po.StartPhase(ctx, ph, info)
		}
	}
	return ctx, func(error) {}
}
