package idemgrpc_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemgrpc"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// orders is a service without generated code: one unary method, Create,
// taking and returning a wrapperspb.StringValue. Its behaviour per request
// value is set by the test.
type orders struct {
	runs    atomic.Int64
	keys    sync.Map // keys seen by the handler, in arrival order per value
	hold    chan struct{}
	entered chan struct{}
	failN   atomic.Int64 // the first failN calls fail with Unavailable
}

const createMethod = "/idemtest.Orders/Create"

func (o *orders) create(ctx context.Context, in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	n := o.runs.Add(1)
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		o.keys.Store(n, md.Get(idemgrpc.MetadataKey))
	}
	if o.failN.Add(-1) >= 0 {
		return nil, status.Error(codes.Unavailable, "database restarting")
	}
	switch in.GetValue() {
	case "hold":
		o.entered <- struct{}{}
		<-o.hold
	case "missing":
		return nil, status.Error(codes.NotFound, "no such customer")
	}
	if _, ok := idem.InfoFromContext(ctx); !ok {
		return nil, status.Error(codes.Internal, "not in an idempotent execution")
	}
	return wrapperspb.String("order for " + in.GetValue() + " #" + time.Now().Format(time.RFC3339Nano)), nil
}

var ordersDesc = grpc.ServiceDesc{
	ServiceName: "idemtest.Orders",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Create",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(*orders).create(ctx, req.(*wrapperspb.StringValue))
			}
			if interceptor == nil {
				return h(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: createMethod}, h)
		},
	}},
}

// health counts Check calls; its reply type is in the protobuf registry.
type health struct {
	healthpb.UnimplementedHealthServer
	runs atomic.Int64
}

func (h *health) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.runs.Add(1)
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

type bundle struct {
	orders *orders
	health *health
	conn   *grpc.ClientConn // without the client interceptor
	client *grpc.ClientConn // with it
}

// setup starts a real gRPC server on a loopback port with the interceptor
// on store, and two client connections to it.
func setup(t *testing.T, store idemstore.Store, copts *idemgrpc.ClientOptions) *bundle {
	t.Helper()
	exec, err := idem.NewExecutor(store, &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{orders: &orders{hold: make(chan struct{}), entered: make(chan struct{}, 8)}, health: &health{}}
	srv := grpc.NewServer(grpc.UnaryInterceptor(idemgrpc.UnaryServerInterceptor(exec, &idemgrpc.ServerOptions{
		RequireFunc: func(m string) bool { return m == createMethod },
	})))
	srv.RegisterService(&ordersDesc, b.orders)
	healthpb.RegisterHealthServer(srv, b.health)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	dial := func(opts ...grpc.DialOption) *grpc.ClientConn {
		c, err := grpc.NewClient(lis.Addr().String(), append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	b.conn = dial()
	b.client = dial(grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(copts)))
	return b
}

func newStore(t *testing.T) idemstore.Store {
	s, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// call invokes Create on conn with key (none if empty), returning the
// reply, the header metadata and the error.
func call(t *testing.T, conn *grpc.ClientConn, key, value string) (*wrapperspb.StringValue, metadata.MD, error) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, key)
	}
	out := new(wrapperspb.StringValue)
	var header metadata.MD
	err := conn.Invoke(ctx, createMethod, wrapperspb.String(value), out, grpc.Header(&header))
	return out, header, err
}

func wantCode(t *testing.T, what string, err error, code codes.Code, reason string) {
	t.Helper()
	if status.Code(err) != code || idemgrpc.Reason(err) != reason {
		t.Errorf("%s: %v (reason %q), want %v with reason %q", what, err, idemgrpc.Reason(err), code, reason)
	}
}

func TestExecuteAndReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), nil)
	first, h1, err := call(t, b.conn, "k-1", "alice")
	if err != nil {
		t.Fatal(err)
	}
	again, h2, err := call(t, b.conn, "k-1", "alice")
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first, again) {
		t.Errorf("replay %v, want %v", again, first)
	}
	if b.orders.runs.Load() != 1 {
		t.Errorf("handler ran %d times", b.orders.runs.Load())
	}
	if h1.Get(idemgrpc.MetadataReplayed)[0] != "false" || h2.Get(idemgrpc.MetadataReplayed)[0] != "true" ||
		len(h2.Get(idemgrpc.MetadataExpiresAt)) != 1 {
		t.Errorf("header metadata: first %v, replay %v", h1, h2)
	}
	// The same key with another request message, and missing keys.
	_, _, err = call(t, b.conn, "k-1", "bob")
	wantCode(t, "reused key", err, codes.FailedPrecondition, idem.CodeKeyReused)
	_, _, err = call(t, b.conn, "", "alice")
	wantCode(t, "missing key", err, codes.InvalidArgument, idem.CodeKeyMissing)
	_, _, err = call(t, b.conn, strings.Repeat("k", idem.MaxKeyLength+1), "alice")
	wantCode(t, "invalid key", err, codes.InvalidArgument, idem.CodeKeyInvalid)
	if b.orders.runs.Load() != 1 {
		t.Errorf("handler ran %d times", b.orders.runs.Load())
	}
}

func TestDeterministicErrorIsReplayedTransientIsReleased(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), nil)
	_, _, err1 := call(t, b.conn, "nf", "missing")
	_, _, err2 := call(t, b.conn, "nf", "missing")
	if status.Code(err1) != codes.NotFound || status.Convert(err2).Message() != status.Convert(err1).Message() || status.Code(err2) != codes.NotFound {
		t.Errorf("NotFound then %v", err2)
	}
	if b.orders.runs.Load() != 1 {
		t.Errorf("a stored NotFound ran the handler %d times", b.orders.runs.Load())
	}
	b.orders.failN.Store(1)
	if _, _, err := call(t, b.conn, "tr", "carol"); status.Code(err) != codes.Unavailable {
		t.Fatalf("first: %v", err)
	}
	if _, _, err := call(t, b.conn, "tr", "carol"); err != nil {
		t.Fatalf("retry after a released Unavailable: %v", err)
	}
	if b.orders.runs.Load() != 3 {
		t.Errorf("handler ran %d times, want 3", b.orders.runs.Load())
	}
}

func TestInFlightIsAborted(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), nil)
	done := make(chan error, 1)
	go func() { _, _, err := call(t, b.conn, "slow", "hold"); done <- err }()
	select {
	case <-b.orders.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the first call never reached the handler")
	}
	_, _, err := call(t, b.conn, "slow", "hold")
	wantCode(t, "duplicate in flight", err, codes.Aborted, idem.CodeRequestInProgress)
	if d, ok := idemgrpc.RetryDelay(err); !ok || d != idem.DefaultRetryAfter {
		t.Errorf("RetryInfo delay %v %v, want %v", d, ok, idem.DefaultRetryAfter)
	}
	close(b.orders.hold)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Now the duplicate replays.
	if _, h, err := call(t, b.conn, "slow", "hold"); err != nil || h.Get(idemgrpc.MetadataReplayed)[0] != "true" {
		t.Errorf("after completion: %v %v", err, h)
	}
}

// downStore fails every call, as an unreachable database does.
type downStore struct{ idemstore.Store }

func (downStore) Claim(context.Context, idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	return idemstore.ClaimResult{}, errors.New("connection refused")
}

func TestStoreDownIsUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t, downStore{newStore(t)}, &idemgrpc.ClientOptions{MaxAttempts: 1})
	_, _, err := call(t, b.conn, "k", "dave")
	wantCode(t, "store down", err, codes.Unavailable, idem.CodeStoreUnavailable)
	if _, ok := idemgrpc.RetryDelay(err); !ok {
		t.Error("no RetryInfo on Unavailable")
	}
	if b.orders.runs.Load() != 0 {
		t.Error("the handler ran with the store down")
	}
}

func TestClientKeepsItsKeyAcrossRetries(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), &idemgrpc.ClientOptions{MaxAttempts: 3, MaxRetryDelay: 50 * time.Millisecond})
	b.orders.failN.Store(2)
	out, _, err := call(t, b.client, "", "erin")
	if err != nil {
		t.Fatalf("call through the client interceptor: %v", err)
	}
	if out.GetValue() == "" || b.orders.runs.Load() != 3 {
		t.Fatalf("reply %q after %d runs", out.GetValue(), b.orders.runs.Load())
	}
	var keys []string
	for i := int64(1); i <= 3; i++ {
		v, _ := b.orders.keys.Load(i)
		ks, _ := v.([]string)
		if len(ks) != 1 || ks[0] == "" {
			t.Fatalf("attempt %d carried keys %q", i, ks)
		}
		keys = append(keys, ks[0])
	}
	if keys[0] != keys[1] || keys[1] != keys[2] {
		t.Errorf("the attempts carried different keys: %q", keys)
	}
	// A second call gets a new key: it runs again.
	if _, _, err := call(t, b.client, "", "erin"); err != nil || b.orders.runs.Load() != 4 {
		t.Errorf("second call: %v, %d runs", err, b.orders.runs.Load())
	}
	// A key the caller chose is kept.
	call(t, b.client, "mine", "erin")
	v, _ := b.orders.keys.Load(int64(5))
	if ks, _ := v.([]string); len(ks) != 1 || ks[0] != "mine" {
		t.Errorf("caller's key replaced: %q", ks)
	}
}

func TestRegisteredReplyTypeAndOptionalKey(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), nil)
	hc := healthpb.NewHealthClient(b.conn)
	// Without a key, a method that does not require one passes through.
	for range 2 {
		if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.MetadataKey, "h")
	for range 2 {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check with a key: %v %v", r, err)
		}
	}
	if b.health.runs.Load() != 3 {
		t.Errorf("Check ran %d times, want 3", b.health.runs.Load())
	}
}

// The scope is per method: one key on two methods names two records, so
// the second call runs (it is not idempotency.key_reused); key_reused is
// the same key on the same method with another request message.
func TestKeyIsScopedByMethod(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), nil)
	if _, _, err := call(t, b.conn, "shared", "alice"); err != nil {
		t.Fatal(err)
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.MetadataKey, "shared")
	var header metadata.MD
	if _, err := healthpb.NewHealthClient(b.conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header)); err != nil {
		t.Fatalf("the key of a Create call on Check: %v", err)
	}
	if b.health.runs.Load() != 1 || header.Get(idemgrpc.MetadataReplayed)[0] != "false" {
		t.Errorf("Check with another method's key: ran %d times, replayed %v", b.health.runs.Load(), header.Get(idemgrpc.MetadataReplayed))
	}
	_, _, err := call(t, b.conn, "shared", "bob")
	wantCode(t, "the key on the same method with another message", err, codes.FailedPrecondition, idem.CodeKeyReused)
	if st, _ := status.FromError(err); strings.Contains(st.Message(), "another method") {
		t.Errorf("the key_reused message blames another method: %q", st.Message())
	}
}
