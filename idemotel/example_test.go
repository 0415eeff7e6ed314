package idemotel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemotel"
	"github.com/idemhq/idem/memstore"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func ExampleNew() {
	spans := tracetest.NewSpanRecorder() // an OTLP exporter in production
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())

	obs, _ := idemotel.New(&idemotel.Config{TracerProvider: tp, Store: "memory"})
	store, _ := memstore.New(nil)
	mw, _ := idem.NewMiddleware(store, &idem.Config{Observer: obs})
	h := mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))

	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "order-1")
	h.ServeHTTP(httptest.NewRecorder(), req)
	for _, s := range spans.Ended() {
		fmt.Println(s.Name())
	}
	// Output:
	// idem.claim
	// idem.execute
	// idem.complete
}
