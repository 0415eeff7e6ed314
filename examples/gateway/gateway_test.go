// Package gateway_test shows idemgrpc behind grpc-gateway, configured as
// docs/grpc.md says ("Behind grpc-gateway"): the gateway's mux passes
// Idempotency-Key through as the idempotency-key metadata and returns idem's
// response metadata under its HTTP names. The route is wired as the
// gateway's generated code wires one (AnnotateContext, Invoke,
// ForwardResponseMessage), around a hand-written gRPC service.
package gateway_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemgrpc"
	"github.com/idemhq/idem/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const createMethod = "/idemtest.Orders/Create"

// gatewayOptions is the configuration docs/grpc.md gives.
func gatewayOptions() []runtime.ServeMuxOption {
	return []runtime.ServeMuxOption{
		runtime.WithIncomingHeaderMatcher(func(key string) (string, bool) {
			if textproto.CanonicalMIMEHeaderKey(key) == "Idempotency-Key" {
				return idemgrpc.MetadataKey, true
			}
			return runtime.DefaultHeaderMatcher(key)
		}),
		runtime.WithOutgoingHeaderMatcher(func(key string) (string, bool) {
			switch key {
			case idemgrpc.MetadataReplayed, idemgrpc.MetadataExpiresAt:
				return textproto.CanonicalMIMEHeaderKey(key), true
			}
			return runtime.MetadataHeaderPrefix + key, true
		}),
	}
}

// serve starts the gRPC service with idemgrpc, and a gateway in front of it
// with opts; it returns the gateway's URL and the number of executions.
func serve(t *testing.T, opts ...runtime.ServeMuxOption) (string, *atomic.Int64) {
	t.Helper()
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.NewExecutor(store, &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runs := new(atomic.Int64)
	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(exec, nil)))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "idemtest.Orders",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: createMethod}, func(ctx context.Context, req any) (any, error) {
				n := runs.Add(1)
				return wrapperspb.String("order for " + req.(*wrapperspb.StringValue).GetValue() + " #" + time.Now().Format(time.RFC3339Nano) + " run " + string(rune('0'+n))), nil
			})
		}}},
	}, nil)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	gw := runtime.NewServeMux(opts...)
	err = gw.HandlePath(http.MethodPost, "/v1/orders", func(w http.ResponseWriter, r *http.Request, _ map[string]string) {
		_, outbound := runtime.MarshalerForRequest(gw, r)
		ctx, err := runtime.AnnotateContext(r.Context(), gw, r, createMethod, runtime.WithHTTPPathPattern("/v1/orders"))
		if err != nil {
			runtime.HTTPError(r.Context(), gw, outbound, w, r, err)
			return
		}
		in := new(wrapperspb.StringValue)
		if err := json.NewDecoder(r.Body).Decode(&in.Value); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var md runtime.ServerMetadata
		out := new(wrapperspb.StringValue)
		err = conn.Invoke(ctx, createMethod, in, out, grpc.Header(&md.HeaderMD), grpc.Trailer(&md.TrailerMD))
		ctx = runtime.NewServerMetadataContext(ctx, md)
		if err != nil {
			runtime.HTTPError(ctx, gw, outbound, w, r, err)
			return
		}
		runtime.ForwardResponseMessage(ctx, gw, outbound, w, r, out)
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(gw)
	t.Cleanup(hs.Close)
	return hs.URL + "/v1/orders", runs
}

func post(t *testing.T, url, key, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(body))
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
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// Configured, the gateway passes the key: a retry replays, byte for byte,
// with Idempotency-Replayed; the key with another body is refused.
func TestGatewayPassesTheKey(t *testing.T) {
	t.Parallel()
	url, runs := serve(t, gatewayOptions()...)
	s1, h1, b1 := post(t, url, `"g-1"`, `"alice"`)
	s2, h2, b2 := post(t, url, `"g-1"`, `"alice"`)
	if s1 != 200 || s2 != 200 || b1 != b2 || runs.Load() != 1 {
		t.Fatalf("first %d %s, retry %d %s, %d runs", s1, b1, s2, b2, runs.Load())
	}
	if h1.Get("Idempotency-Replayed") != "false" || h2.Get("Idempotency-Replayed") != "true" || h2.Get("Idempotency-Key-Expires-At") == "" {
		t.Errorf("headers: first %v, retry %v", h1, h2)
	}
	s, _, b := post(t, url, `"g-1"`, `"bob"`)
	if s != http.StatusBadRequest || !strings.Contains(b, idem.CodeKeyReused) {
		t.Errorf("the key with another body: %d %s", s, b)
	}
	if s, _, b := post(t, url, "", `"alice"`); s != http.StatusBadRequest || !strings.Contains(b, idem.CodeKeyMissing) {
		t.Errorf("no key: %d %s", s, b)
	}
}

// Left at its defaults, the gateway drops the header: every call is
// refused as having no key.
func TestDefaultGatewayDropsTheKey(t *testing.T) {
	t.Parallel()
	url, runs := serve(t)
	if s, _, b := post(t, url, `"g-1"`, `"alice"`); s != http.StatusBadRequest || !strings.Contains(b, idem.CodeKeyMissing) || runs.Load() != 0 {
		t.Errorf("default gateway: %d %s, %d runs", s, b, runs.Load())
	}
}
