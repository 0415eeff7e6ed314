package idemconnect_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"connectrpc.com/connect"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemconnect"
	"github.com/idemhq/idem/memstore"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// BenchmarkHandler measures a unary Connect call (the Connect protocol,
// binary protobuf, in process through the handler's ServeHTTP) bare and
// with the handler interceptor on memstore: a first execution per key, and
// a replay of one key.
//
//	cd idemconnect && go test -run '^$' -bench Handler -benchmem -count 5
func BenchmarkHandler(b *testing.B) {
	create := func(_ context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
		return connect.NewResponse(wrapperspb.String("order for " + req.Msg.GetValue())), nil
	}
	body, _ := proto.Marshal(wrapperspb.String("book"))
	serve := func(b *testing.B, h http.Handler, key func(i int) string) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			req := httptest.NewRequest(http.MethodPost, createProc, bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/proto")
			if key != nil {
				req.Header.Set(idemconnect.HeaderKey, key(i))
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				b.Fatalf("status %d: %s", w.Code, w.Body)
			}
		}
	}
	protected := func(b *testing.B) http.Handler {
		store, err := memstore.New(nil)
		if err != nil {
			b.Fatal(err)
		}
		exec, err := idem.NewExecutor(store, nil)
		if err != nil {
			b.Fatal(err)
		}
		return connect.NewUnaryHandler(createProc, create, connect.WithSchema(method("Create")),
			connect.WithInterceptors(idemconnect.NewHandlerInterceptor(exec, nil)))
	}
	b.Run("bare", func(b *testing.B) {
		serve(b, connect.NewUnaryHandler(createProc, create, connect.WithSchema(method("Create"))), nil)
	})
	b.Run("execute", func(b *testing.B) {
		serve(b, protected(b), func(i int) string { return "k-" + strconv.Itoa(i) })
	})
	b.Run("replay", func(b *testing.B) {
		serve(b, protected(b), func(int) string { return "k" })
	})
}
