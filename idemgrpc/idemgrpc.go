// Package idemgrpc makes unary gRPC methods safe to retry with idem: a
// server interceptor that runs each call at most once per idempotency key
// and replays the stored reply (or error) to retries, and a client
// interceptor that gives every call a key and keeps it across its retries.
//
// The contract, with its status codes, is in docs/grpc.md:
//
//   - the key travels in the "idempotency-key" request metadata, in the
//     forms idem.ParseKey accepts;
//   - the stored response is the serialized reply message, or the call's
//     status (code, message, details) for a deterministic error;
//   - missing or invalid key: InvalidArgument; another call with the key
//     still running: Aborted with a RetryInfo detail; the key reused on
//     the same method with another request message: FailedPrecondition
//     (records are scoped by tenant and method, so the same key on another
//     method is another record); store unavailable: Unavailable with a
//     RetryInfo detail. Each of these
//     carries an ErrorInfo detail (domain "idem") whose reason is the idem
//     problem code, such as "idempotency.key_reused".
//
// The server's responses carry "idempotency-replayed" ("true" or "false")
// and "idempotency-key-expires-at" (RFC 3339) header metadata.
package idemgrpc

import (
	"context"
	"crypto/rand"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/internal/rpcidem"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Metadata keys idemgrpc reads and writes (gRPC metadata keys are lower
// case).
const (
	// MetadataKey carries the idempotency key on a request.
	MetadataKey = "idempotency-key"
	// MetadataReplayed is "true" on a replayed response, "false" otherwise.
	MetadataReplayed = "idempotency-replayed"
	// MetadataExpiresAt carries, in RFC 3339 UTC, when the key's record
	// expires.
	MetadataExpiresAt = "idempotency-key-expires-at"
)

// ErrorDomain is the domain of the ErrorInfo detail on idem's own errors.
const ErrorDomain = rpcidem.ErrorDomain

// ServerOptions configure UnaryServerInterceptor. A nil *ServerOptions means
// all defaults.
type ServerOptions struct {
	// RequireFunc reports whether a method needs a key; a call without one
	// is answered InvalidArgument. Calls to other methods are protected
	// when they carry a key and pass through when they do not. Defaults to
	// every method requiring a key.
	RequireFunc func(fullMethod string) bool

	// TenantFunc returns the tenant or principal a call belongs to (from
	// its authentication, typically); records are scoped by tenant and
	// method, so that tenants never see each other's records. An error is
	// returned to the client as it is if it is a gRPC status error, and
	// otherwise as InvalidArgument. Defaults to one scope for everyone.
	TenantFunc func(ctx context.Context) (string, error)

	// OutcomeFunc decides, from the code a call ended with, whether its
	// outcome is stored (and replayed to retries) or released (so that a
	// retry runs again). Defaults to DefaultOutcome.
	OutcomeFunc func(codes.Code) idem.Outcome

	// RetryAfter is the delay sent in the RetryInfo detail of Aborted (in
	// progress) and Unavailable answers. Keep it equal to the executor's
	// Config.RetryAfter. Defaults to idem.DefaultRetryAfter (1 second).
	RetryAfter time.Duration
}

// DefaultOutcome stores OK and the codes that describe the request itself
// (InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
// FailedPrecondition, OutOfRange, Unauthenticated): a retry would get the
// same answer. It releases every other code (Unavailable, Aborted,
// DeadlineExceeded, Internal, Unknown, ResourceExhausted, Canceled,
// DataLoss, Unimplemented), which invites a retry that should run again.
func DefaultOutcome(c codes.Code) idem.Outcome {
	if rpcidem.DefaultStored(rpcidem.Code(c)) {
		return idem.OutcomeStore
	}
	return idem.OutcomeRelease
}

// Stored responses: the reply's bytes with status 200, or an error's
// status (google.rpc.Status bytes) with the HTTP status gRPC maps its code
// to, so that idem's events and metrics read naturally. The gRPC code is
// kept in this header field. idemconnect reads and writes the same format.
const storedCodeField = rpcidem.CodeField

// UnaryServerInterceptor returns an interceptor that runs each unary call
// with a key at most once per key through exec (built with idem.NewExecutor;
// its Lease, TTL, Wait, StoreTimeout, Observer and Logger apply; its
// OutcomeFunc must keep the default for status 200 and the 4xx codes of
// DefaultOutcome, which the default does).
//
// The fingerprint covers the method and the request message in
// deterministic protobuf encoding, so a retry must send an equal message.
// A replayed reply is decoded into the method's output type when it is in
// the global protobuf registry (generated code registers it), and is
// otherwise sent as the stored bytes, which the client decodes alike.
func UnaryServerInterceptor(exec *idem.Executor, opts *ServerOptions) grpc.UnaryServerInterceptor {
	var o ServerOptions
	if opts != nil {
		o = *opts
	}
	if o.RequireFunc == nil {
		o.RequireFunc = func(string) bool { return true }
	}
	if o.OutcomeFunc == nil {
		o.OutcomeFunc = DefaultOutcome
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = idem.DefaultRetryAfter
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		values := md.Get(MetadataKey)
		if len(values) == 0 && !o.RequireFunc(info.FullMethod) {
			return handler(ctx, req)
		}
		key, err := idem.ParseKey(values)
		if err != nil {
			return nil, answer(rpcidem.KeyAnswer(err, "the idempotency-key metadata"), 0)
		}
		tenant := ""
		if o.TenantFunc != nil {
			if tenant, err = o.TenantFunc(ctx); err != nil {
				if _, ok := status.FromError(err); ok {
					return nil, err
				}
				return nil, answer(rpcidem.ScopeAnswer(err), 0)
			}
		}
		msg, ok := req.(proto.Message)
		if !ok {
			return nil, status.Errorf(codes.Internal, "idemgrpc: request of type %T is not a protobuf message", req)
		}
		body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: encode the request: %v", err)
		}
		fp, err := rpcidem.Fingerprint(info.FullMethod, body)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: fingerprint: %v", err)
		}

		var reply any
		res, err := exec.Do(ctx, idem.DoParams{Scope: idem.Scope(tenant, info.FullMethod), Key: key, Fingerprint: fp,
			Operation: info.FullMethod}, func(ctx context.Context) (*idem.Response, error) {
			var herr error
			reply, herr = handler(ctx, req)
			return encode(reply, herr, o.OutcomeFunc)
		})
		if !res.ExpiresAt.IsZero() && !res.Released {
			_ = grpc.SetHeader(ctx, metadata.Pairs(MetadataExpiresAt, res.ExpiresAt.UTC().Format(time.RFC3339)))
		}
		switch {
		case err == nil && res.Replayed:
			_ = grpc.SetHeader(ctx, metadata.Pairs(MetadataReplayed, "true"))
			return decode(res.Response, info.FullMethod)
		case err == nil:
			_ = grpc.SetHeader(ctx, metadata.Pairs(MetadataReplayed, "false"))
			if res.Response.StatusCode != 200 || reply == nil {
				return decode(res.Response, info.FullMethod)
			}
			return reply, nil
		}
		if a, ok := rpcidem.ExecAnswer(err); ok {
			return nil, answer(a, o.RetryAfter)
		}
		// The handler's own error, released so that a retry runs again.
		return nil, err
	}
}

// encode turns a handler's result into the response to store, or returns
// the error (releasing the key) when OutcomeFunc says so.
func encode(reply any, herr error, outcome func(codes.Code) idem.Outcome) (*idem.Response, error) {
	st, _ := status.FromError(herr)
	if outcome(st.Code()) == idem.OutcomeRelease {
		if herr == nil {
			herr = status.Error(codes.Unknown, "idemgrpc: OutcomeFunc released a successful call")
		}
		return nil, herr
	}
	var (
		body []byte
		err  error
		code = 200
	)
	if herr == nil {
		m, ok := reply.(proto.Message)
		if !ok {
			return nil, status.Errorf(codes.Internal, "idemgrpc: reply of type %T is not a protobuf message", reply)
		}
		body, err = proto.Marshal(m)
	} else {
		body, err = proto.Marshal(st.Proto())
		code = rpcidem.HTTPStatus(rpcidem.Code(st.Code()))
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: encode the reply: %v", err)
	}
	return &idem.Response{StatusCode: code, Header: map[string][]string{storedCodeField: {strconv.Itoa(int(st.Code()))}}, Body: body}, nil
}

// decode turns a stored response back into a reply or a status error.
func decode(r *idem.Response, fullMethod string) (any, error) {
	c, err := strconv.Atoi(firstValue(r.Header[storedCodeField]))
	if err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: stored response without a gRPC code")
	}
	if codes.Code(c) != codes.OK {
		var sp spb.Status
		if err := proto.Unmarshal(r.Body, &sp); err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: stored status: %v", err)
		}
		return nil, status.ErrorProto(&sp)
	}
	if mt := outputType(fullMethod); mt != nil {
		m := mt.New().Interface()
		if err := proto.Unmarshal(r.Body, m); err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: stored reply: %v", err)
		}
		return m, nil
	}
	// Without the method's descriptor, send the stored bytes as they are:
	// an empty message whose unknown fields are those bytes encodes to
	// exactly them.
	m := &emptypb.Empty{}
	m.ProtoReflect().SetUnknown(protoreflect.RawFields(r.Body))
	return m, nil
}

func firstValue(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	return vs[0]
}

// outputType returns the reply type of a method from the global registry.
func outputType(fullMethod string) protoreflect.MessageType {
	name := strings.ReplaceAll(strings.TrimPrefix(fullMethod, "/"), "/", ".")
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(name))
	if err != nil {
		return nil
	}
	md, ok := d.(protoreflect.MethodDescriptor)
	if !ok {
		return nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName())
	if err != nil {
		return nil
	}
	return mt
}

// answer is one of idem's own errors: an ErrorInfo detail with the problem
// code, and a RetryInfo detail of retry when the client should retry.
func answer(a rpcidem.Answer, retry time.Duration) error {
	st := status.New(codes.Code(a.Code), a.Message)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Domain: ErrorDomain, Reason: a.Reason}}
	if a.Retry {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	if withDetails, err := st.WithDetails(details...); err == nil {
		st = withDetails
	}
	return st.Err()
}

// Reason returns the idem problem code of an error idemgrpc's server
// interceptor produced (such as idem.CodeRequestInProgress), or "".
func Reason(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// RetryDelay returns the delay a RetryInfo detail of err asks for, and
// whether there is one.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// NewKey returns a fresh idempotency key: 26 random base32 characters (130
// bits), as the client interceptor generates them.
func NewKey() string { return rand.Text() }
