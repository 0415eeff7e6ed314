package idemconnect_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemconnect"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The test service, without code generation: its schema is built here from
// a descriptor (as generated code embeds one), its messages are
// wrapperspb.StringValue.
//
//	service Orders {
//	  rpc Create(StringValue) returns (StringValue);
//	  rpc Get(StringValue) returns (StringValue) { option idempotency_level = NO_SIDE_EFFECTS; }
//	  rpc Watch(StringValue) returns (stream StringValue);
//	}
//
// Plain is Create's twin registered without a schema, as hand-written
// handlers are.
const (
	createProc = "/idemtest.Orders/Create"
	getProc    = "/idemtest.Orders/Get"
	watchProc  = "/idemtest.Orders/Watch"
	plainProc  = "/idemtest.Orders/Plain"
)

var ordersSchema = func() protoreflect.ServiceDescriptor {
	sv := ".google.protobuf.StringValue"
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name:       new("idemtest/orders.proto"),
		Package:    new("idemtest"),
		Dependency: []string{"google/protobuf/wrappers.proto"},
		Syntax:     new("proto3"),
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: new("Orders"),
			Method: []*descriptorpb.MethodDescriptorProto{
				{Name: new("Create"), InputType: &sv, OutputType: &sv},
				{Name: new("Get"), InputType: &sv, OutputType: &sv, Options: &descriptorpb.MethodOptions{
					IdempotencyLevel: descriptorpb.MethodOptions_NO_SIDE_EFFECTS.Enum()}},
				{Name: new("Watch"), InputType: &sv, OutputType: &sv, ServerStreaming: new(true)},
			},
		}},
	}, protoregistry.GlobalFiles)
	if err != nil {
		panic(err)
	}
	return fd.Services().ByName("Orders")
}()

func method(name protoreflect.Name) protoreflect.MethodDescriptor {
	return ordersSchema.Methods().ByName(name)
}

// orders is the service. What Create does depends on the request's value:
// "hold" waits for the test, "missing" fails with a stored NotFound, and
// the first failN calls fail with a released Unavailable.
type orders struct {
	runs    atomic.Int64
	keys    sync.Map // run number -> the Idempotency-Key values it saw
	entered chan struct{}
	hold    chan struct{}
	failN   atomic.Int64
}

func (o *orders) create(ctx context.Context, req *connect.Request[wrapperspb.StringValue]) (*connect.Response[wrapperspb.StringValue], error) {
	n := o.runs.Add(1)
	o.keys.Store(n, req.Header().Values(idemconnect.HeaderKey))
	if o.failN.Add(-1) >= 0 {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("database restarting"))
	}
	switch req.Msg.GetValue() {
	case "hold":
		o.entered <- struct{}{}
		<-o.hold
	case "missing":
		ce := connect.NewError(connect.CodeNotFound, errors.New("no such customer"))
		d, _ := connect.NewErrorDetail(&errdetails.ResourceInfo{ResourceType: "customer", ResourceName: "c-404"})
		ce.AddDetail(d)
		ce.Meta().Set("X-Lookup", "customers-db")
		return nil, ce
	}
	if _, ok := idem.InfoFromContext(ctx); !ok && len(req.Header().Values(idemconnect.HeaderKey)) > 0 {
		return nil, connect.NewError(connect.CodeInternal, errors.New("not in an idempotent execution"))
	}
	if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
		info.ResponseHeader().Set("X-Via-Call-Info", "set")
	}
	res := connect.NewResponse(wrapperspb.String("order for " + req.Msg.GetValue() + " #" + time.Now().Format(time.RFC3339Nano)))
	res.Header().Set("X-Order-Run", "run")
	res.Trailer().Set("X-Ledger", "booked")
	return res, nil
}

func (o *orders) watch(_ context.Context, req *connect.Request[wrapperspb.StringValue], s *connect.ServerStream[wrapperspb.StringValue]) error {
	o.runs.Add(1)
	for i := range 3 {
		if err := s.Send(wrapperspb.String(req.Msg.GetValue() + string(rune('0'+i)))); err != nil {
			return err
		}
	}
	return nil
}

type bundle struct {
	orders *orders
	srv    *httptest.Server
}

func newStore(t *testing.T) idemstore.Store {
	t.Helper()
	s, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// setup serves the Orders procedures with the handler interceptor over
// store on a real loopback server speaking HTTP/2 over TLS (gRPC needs
// HTTP/2; Connect and gRPC-Web work over either).
func setup(t *testing.T, store idemstore.Store, opts *idemconnect.HandlerOptions) *bundle {
	t.Helper()
	exec, err := idem.NewExecutor(store, &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return setupExec(t, exec, opts)
}

// setupExec is setup with an executor of the test's own.
func setupExec(t *testing.T, exec *idem.Executor, opts *idemconnect.HandlerOptions) *bundle {
	t.Helper()
	b := &bundle{orders: &orders{entered: make(chan struct{}, 16), hold: make(chan struct{})}}
	icpt := connect.WithInterceptors(idemconnect.NewHandlerInterceptor(exec, opts))
	mux := http.NewServeMux()
	mux.Handle(createProc, connect.NewUnaryHandler(createProc, b.orders.create, icpt, connect.WithSchema(method("Create"))))
	mux.Handle(getProc, connect.NewUnaryHandler(getProc, b.orders.create, icpt, connect.WithSchema(method("Get")),
		connect.WithIdempotency(connect.IdempotencyNoSideEffects)))
	mux.Handle(watchProc, connect.NewServerStreamHandler(watchProc, b.orders.watch, icpt, connect.WithSchema(method("Watch"))))
	mux.Handle(plainProc, connect.NewUnaryHandler(plainProc, b.orders.create, icpt))
	b.srv = httpServer(t, mux)
	return b
}

// httpServer serves h on a loopback port, HTTP/2 over TLS, until the test
// ends; its Client trusts it.
func httpServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// protocols are the client configurations every protocol test runs with.
var protocols = []struct {
	name string
	opts []connect.ClientOption
}{
	{"connect+proto", nil},
	{"connect+json", []connect.ClientOption{connect.WithProtoJSON()}},
	{"grpc", []connect.ClientOption{connect.WithGRPC()}},
	{"grpcweb", []connect.ClientOption{connect.WithGRPCWeb()}},
}

func (b *bundle) client(t *testing.T, proc string, opts ...connect.ClientOption) *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue] {
	t.Helper()
	return connect.NewClient[wrapperspb.StringValue, wrapperspb.StringValue](b.srv.Client(), b.srv.URL+proc, opts...)
}

// call calls the client with key (none if empty) and, after it, optional
// extra header fields.
func call(t *testing.T, c *connect.Client[wrapperspb.StringValue, wrapperspb.StringValue], key, value string, header ...string) (*connect.Response[wrapperspb.StringValue], error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req := connect.NewRequest(wrapperspb.String(value))
	if key != "" {
		req.Header().Set(idemconnect.HeaderKey, key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header().Add(header[i], header[i+1])
	}
	return c.CallUnary(ctx, req)
}

func wantCode(t *testing.T, what string, err error, code connect.Code, reason string) {
	t.Helper()
	if connect.CodeOf(err) != code || idemconnect.Reason(err) != reason {
		t.Errorf("%s: %v (reason %q), want %v with reason %q", what, err, idemconnect.Reason(err), code, reason)
	}
}

// waitEntered waits until n calls are inside the handler.
func (b *bundle) waitEntered(t *testing.T, n int) {
	t.Helper()
	for range n {
		select {
		case <-b.orders.entered:
		case <-time.After(30 * time.Second):
			t.Fatal("a call never reached the handler")
		}
	}
}

func header(h http.Header, k string) string { return strings.Join(h.Values(k), ",") }
