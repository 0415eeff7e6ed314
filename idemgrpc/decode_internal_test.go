package idemgrpc

import (
	"testing"

	"github.com/idemhq/idem"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestDecodeUsesTheRegisteredReplyType(t *testing.T) {
	want := &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}
	resp, err := encode(want, nil, DefaultOutcome)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decode(resp, "/grpc.health.v1.Health/Check")
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := got.(*healthpb.HealthCheckResponse); !ok || !proto.Equal(m, want) {
		t.Errorf("decoded %T %v, want %v", got, got, want)
	}
	// An unregistered method gets the stored bytes, unchanged on the wire.
	other := wrapperspb.String("x")
	resp, _ = encode(other, nil, DefaultOutcome)
	got, err = decode(resp, "/unknown.Service/Method")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := proto.Marshal(got.(*emptypb.Empty))
	var back wrapperspb.StringValue
	if err := proto.Unmarshal(b, &back); err != nil || back.GetValue() != "x" {
		t.Errorf("raw replay decodes to %q, %v", back.GetValue(), err)
	}
}

func TestDefaultOutcome(t *testing.T) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		stored := DefaultOutcome(c) == idem.OutcomeStore
		want := map[codes.Code]bool{codes.OK: true, codes.InvalidArgument: true, codes.NotFound: true, codes.AlreadyExists: true,
			codes.PermissionDenied: true, codes.FailedPrecondition: true, codes.OutOfRange: true, codes.Unauthenticated: true}[c]
		if stored != want {
			t.Errorf("%v stored = %v, want %v", c, stored, want)
		}
	}
}
