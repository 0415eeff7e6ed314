package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
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
// and metrics over OTLP/HTTP, each when its endpoint is configured by the
// standard variables (see otlpEnv), configured by the standard OTEL_*
// variables (headers, timeout, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES,
// OTEL_METRIC_EXPORT_INTERVAL, ...). The zero value is off: it wraps
// nothing and adds no observer.
type telemetry struct {
	obs      *idemotel.Observer
	shutdown func(context.Context) error
}

// Metric export defaults when the environment does not set them. The
// interval is idem's (the OpenTelemetry default is 60 s, long for a demo);
// the timeout is OpenTelemetry's.
const (
	defaultMetricInterval = 15 * time.Second
	defaultMetricTimeout  = 30 * time.Second
)

// otlpEnv is the OTLP export the environment asks for.
type otlpEnv struct {
	// traces and metrics are the signals' endpoint URLs, "" when the
	// signal is not exported.
	traces, metrics string
	// interval and timeout are the metric reader's
	// (OTEL_METRIC_EXPORT_INTERVAL, OTEL_METRIC_EXPORT_TIMEOUT).
	interval, timeout time.Duration
}

// readOTLPEnv reads the standard variables, as OpenTelemetry specifies
// them (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/
// and .../protocol/exporter/):
//
//   - a signal is exported when OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT (used
//     as it is) or OTEL_EXPORTER_OTLP_ENDPOINT (with /v1/traces or
//     /v1/metrics appended) is set, unless OTEL_<SIGNAL>S_EXPORTER is
//     none; OTEL_SDK_DISABLED=true turns both off;
//   - OTEL_METRIC_EXPORT_INTERVAL and OTEL_METRIC_EXPORT_TIMEOUT are
//     milliseconds.
//
// What idem cannot honour is an error, not a silent default: a protocol
// other than http/protobuf, an exporter other than otlp or none, an
// endpoint that is not an http(s) URL, an interval that is not a positive
// number of milliseconds.
func readOTLPEnv(getenv func(string) string) (otlpEnv, error) {
	e := otlpEnv{interval: defaultMetricInterval, timeout: defaultMetricTimeout}
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return e, nil
	}
	base := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT"))
	for _, sig := range []struct {
		name, path string
		dst        *string
	}{{"TRACES", "/v1/traces", &e.traces}, {"METRICS", "/v1/metrics", &e.metrics}} {
		switch exp := strings.TrimSpace(getenv("OTEL_" + sig.name + "_EXPORTER")); exp {
		case "", "otlp":
		case "none":
			continue
		default:
			return e, fmt.Errorf("OTEL_%s_EXPORTER=%s: idem exports over otlp only (or none)", sig.name, exp)
		}
		for _, v := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_" + sig.name + "_PROTOCOL"} {
			if p := strings.TrimSpace(getenv(v)); p != "" && p != "http/protobuf" {
				return e, fmt.Errorf("%s=%s: idem exports over OTLP/HTTP with protobuf only; set http/protobuf or unset it", v, p)
			}
		}
		name, endpoint := "OTEL_EXPORTER_OTLP_"+sig.name+"_ENDPOINT", strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_"+sig.name+"_ENDPOINT"))
		if endpoint == "" && base != "" {
			name, endpoint = "OTEL_EXPORTER_OTLP_ENDPOINT", strings.TrimRight(base, "/")+sig.path
		}
		if endpoint == "" {
			continue
		}
		u, err := url.Parse(endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return e, fmt.Errorf("%s=%s: not an http:// or https:// URL", name, getenv(name))
		}
		*sig.dst = u.Redacted()
	}
	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{"OTEL_METRIC_EXPORT_INTERVAL", &e.interval}, {"OTEL_METRIC_EXPORT_TIMEOUT", &e.timeout}} {
		v := strings.TrimSpace(getenv(d.name))
		if v == "" {
			continue
		}
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || ms > int64(idem.MaxTTL/time.Millisecond) {
			return e, fmt.Errorf("%s=%s: must be a positive whole number of milliseconds (e.g. 5000)", d.name, v)
		}
		*d.dst = time.Duration(ms) * time.Millisecond
	}
	return e, nil
}

// startTelemetry sets up OTLP export if the environment asks for it. The
// exporters connect lazily: a collector that is down costs dropped
// telemetry, never a failed start or a slow request. Variables idem
// cannot honour fail the start (see readOTLPEnv).
func startTelemetry(ctx context.Context, service, store string, logger *slog.Logger) (*telemetry, error) {
	env, err := readOTLPEnv(os.Getenv)
	if err != nil {
		return nil, err
	}
	if env.traces == "" && env.metrics == "" {
		return &telemetry{}, nil
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, err
	}
	// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the default
	// service name.
	if envRes, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
		if merged, err := resource.Merge(res, envRes); err == nil {
			res = merged
		}
	}
	// The exporters read their endpoints (and headers, timeouts, TLS)
	// from the same variables themselves.
	cfg := &idemotel.Config{Store: store}
	var shutdowns []func(context.Context) error
	if env.traces != "" {
		traceExp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, err
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(traceExp), sdktrace.WithResource(res))
		otel.SetTracerProvider(tp)
		cfg.TracerProvider = tp
		shutdowns = append(shutdowns, tp.Shutdown)
	}
	if env.metrics != "" {
		metricExp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			return nil, err
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithResource(res),
			sdkmetric.WithReader(sdkmetric.NewPeriodicReader(metricExp,
				sdkmetric.WithInterval(env.interval), sdkmetric.WithTimeout(env.timeout))))
		otel.SetMeterProvider(mp)
		cfg.MeterProvider = mp
		shutdowns = append(shutdowns, mp.Shutdown)
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("OpenTelemetry export failed", "error", err)
	}))
	obs, err := idemotel.New(cfg)
	if err != nil {
		return nil, err
	}
	logger.Info("exporting OpenTelemetry over OTLP/HTTP", "traces", cmp.Or(env.traces, "off"), "metrics", cmp.Or(env.metrics, "off"),
		"metric_interval", env.interval.String(), "metric_timeout", env.timeout.String())
	return &telemetry{obs: obs, shutdown: func(ctx context.Context) error {
		var errs []error
		for _, f := range shutdowns {
			errs = append(errs, f(ctx))
		}
		return errors.Join(errs...)
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
