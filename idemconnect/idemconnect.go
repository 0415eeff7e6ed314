// Package idemconnect makes unary Connect procedures (connectrpc.com/connect)
// safe to retry with idem: a handler interceptor that runs each call at most
// once per idempotency key and replays the stored reply (or error) to
// retries, and a client interceptor that gives every call a key and keeps it
// across its retries.
//
//	exec, err := idem.NewExecutor(store, nil)
//	...
//	path, handler := ordersv1connect.NewOrdersHandler(svc, connect.WithInterceptors(
//		idemconnect.NewHandlerInterceptor(exec, &idemconnect.HandlerOptions{TenantFunc: callerOf})))
//
//	client := ordersv1connect.NewOrdersClient(http.DefaultClient, url,
//		connect.WithInterceptors(idemconnect.NewClientInterceptor(nil)))
//
// The contract is idemgrpc's, and docs/grpc.md has both:
//
//   - the key travels in the Idempotency-Key request header, which all
//     three protocols (Connect, gRPC, gRPC-Web) carry, in the forms
//     idem.ParseKey accepts;
//   - the record scope is the tenant (HandlerOptions.TenantFunc) and the
//     procedure ("/pkg.Service/Method"); the fingerprint covers the
//     procedure and the request message in deterministic protobuf encoding,
//     whatever the protocol and codec, so a retry must send an equal
//     message;
//   - the stored response is the serialized reply message with the
//     response headers and trailers the handler set, or the error (code,
//     message, details, metadata) for a deterministic error;
//   - missing or invalid key: InvalidArgument; another call with the key
//     still running: Aborted with a RetryInfo detail; the key reused on
//     the same procedure with another request message: FailedPrecondition;
//     store unavailable: Unavailable with a RetryInfo detail. Each carries
//     an ErrorInfo detail (domain "idem") whose reason is the idem problem
//     code, such as "idempotency.key_reused"; Reason and RetryDelay read
//     them.
//
// Responses carry Idempotency-Replayed ("true" or "false") and
// Idempotency-Key-Expires-At (RFC 3339) headers.
//
// Streaming procedures pass through both interceptors untouched: a stream
// has no single reply to store. Records are written in idemgrpc's format,
// so a service that moves from grpc-go to Connect on the same store keeps
// answering the retries of calls the old server ran.
package idemconnect

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/internal/rpcidem"
	"google.golang.org/protobuf/proto"
)

// Header fields idemconnect reads and writes: the HTTP middleware's names.
// Over the gRPC protocols they travel as the lower-case metadata keys
// idemgrpc uses ("idempotency-key").
const (
	// HeaderKey carries the idempotency key on a request.
	HeaderKey = idem.HeaderKey
	// HeaderReplayed is "true" on a replayed response, "false" otherwise.
	HeaderReplayed = idem.HeaderReplayed
	// HeaderExpiresAt carries, in RFC 3339 UTC, when the key's record
	// expires.
	HeaderExpiresAt = idem.HeaderExpiresAt
)

// ErrorDomain is the domain of the ErrorInfo detail on idem's own errors.
const ErrorDomain = rpcidem.ErrorDomain

// HandlerOptions configure NewHandlerInterceptor. A nil *HandlerOptions
// means all defaults.
type HandlerOptions struct {
	// RequireFunc reports whether a procedure needs a key; a call without
	// one is answered InvalidArgument. Calls to other procedures are
	// protected when they carry a key and pass through when they do not.
	// Defaults to requiring a key for every procedure whose idempotency
	// level is connect.IdempotencyUnknown (the level generated code sets
	// from the method's idempotency_level option): procedures marked
	// NO_SIDE_EFFECTS or IDEMPOTENT are safe to retry without one.
	RequireFunc func(connect.Spec) bool

	// TenantFunc returns the tenant or principal a call belongs to (from
	// its authentication, in ctx or the request's headers); records are
	// scoped by tenant and procedure, so that tenants never see each
	// other's records. An error is returned to the client as it is if it
	// is a *connect.Error, and otherwise as InvalidArgument. Defaults to one
	// scope for everyone: set it in any service with more than one caller.
	TenantFunc func(ctx context.Context, req connect.AnyRequest) (string, error)

	// OutcomeFunc decides, from the code a call ended with (0 for success),
	// whether its outcome is stored (and replayed to retries) or released
	// (so that a retry runs again). A released success is sent to the
	// client as it is. Defaults to DefaultOutcome.
	OutcomeFunc func(connect.Code) idem.Outcome

	// RetryAfter is the delay sent in the RetryInfo detail (and a
	// Retry-After header) of Aborted (in progress) and Unavailable answers.
	// Keep it equal to the executor's Config.RetryAfter. Defaults to
	// idem.DefaultRetryAfter (1 second).
	RetryAfter time.Duration
}

// DefaultOutcome stores success and the codes that describe the request
// itself (InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
// FailedPrecondition, OutOfRange, Unauthenticated): a retry would get the
// same answer. It releases every other code (Unavailable, Aborted,
// DeadlineExceeded, Internal, Unknown, ResourceExhausted, Canceled,
// DataLoss, Unimplemented), which invites a retry that should run again.
func DefaultOutcome(c connect.Code) idem.Outcome {
	if rpcidem.DefaultStored(rpcidem.Code(c)) {
		return idem.OutcomeStore
	}
	return idem.OutcomeRelease
}

// errReleased is what the operation returns for a success OutcomeFunc
// releases: the executor then frees the key, and the reply is sent as it is.
var errReleased = errors.New("idemconnect: the outcome policy released a successful call")

// NewHandlerInterceptor returns an interceptor for Connect handlers that
// runs each unary call with a key at most once per key through exec (built
// with idem.NewExecutor; its Lease, TTL, Wait, StoreTimeout, Observer and
// Logger apply; its OutcomeFunc must keep the default for status 200 and
// the 4xx codes of DefaultOutcome, which the default does). Install it with
// connect.WithInterceptors on a handler; on a client, its calls fail with
// Internal. Streaming procedures pass through untouched.
func NewHandlerInterceptor(exec *idem.Executor, opts *HandlerOptions) connect.Interceptor {
	var o HandlerOptions
	if opts != nil {
		o = *opts
	}
	if o.RequireFunc == nil {
		o.RequireFunc = func(s connect.Spec) bool { return s.IdempotencyLevel == connect.IdempotencyUnknown }
	}
	if o.OutcomeFunc == nil {
		o.OutcomeFunc = DefaultOutcome
	}
	if o.RetryAfter <= 0 {
		o.RetryAfter = idem.DefaultRetryAfter
	}
	h := &handler{exec: exec, o: o, retryAfter: strconv.Itoa(int((o.RetryAfter + time.Second - 1) / time.Second))}
	return connect.UnaryInterceptorFunc(h.wrap)
}

type handler struct {
	exec       *idem.Executor
	o          HandlerOptions
	retryAfter string // RetryAfter in whole seconds, rounded up
}

// call is one intercepted call's state.
type call struct {
	h    *handler
	next connect.UnaryFunc
	req  connect.AnyRequest
	resp connect.AnyResponse // the handler's reply
	herr error               // the handler's error
}

func (h *handler) wrap(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		spec := req.Spec()
		if spec.IsClient {
			return nil, connect.NewError(connect.CodeInternal,
				errors.New("idemconnect: NewHandlerInterceptor is installed on a client; use NewClientInterceptor"))
		}
		values := req.Header().Values(HeaderKey)
		if len(values) == 0 && !h.o.RequireFunc(spec) {
			return next(ctx, req)
		}
		key, err := idem.ParseKey(values)
		if err != nil {
			return nil, h.answer(rpcidem.KeyAnswer(err, "the Idempotency-Key header"), time.Time{})
		}
		tenant := ""
		if h.o.TenantFunc != nil {
			if tenant, err = h.o.TenantFunc(ctx, req); err != nil {
				if ce := new(connect.Error); errors.As(err, &ce) {
					return nil, err
				}
				return nil, h.answer(rpcidem.ScopeAnswer(err), time.Time{})
			}
		}
		msg, ok := req.Any().(proto.Message)
		if !ok {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: request of type %T is not a protobuf message", req.Any()))
		}
		body, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: encode the request: %w", err))
		}
		fp, err := rpcidem.Fingerprint(spec.Procedure, body)
		if err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: fingerprint: %w", err))
		}
		c := &call{h: h, next: next, req: req}
		res, err := h.exec.Do(ctx, idem.DoParams{Scope: idem.Scope(tenant, spec.Procedure), Key: key,
			Fingerprint: fp, Operation: spec.Procedure}, c.run)
		return c.answer(ctx, res, err)
	}
}

// run is the operation the executor runs at most once: the handler, whose
// outcome becomes the stored response.
func (c *call) run(ctx context.Context) (*idem.Response, error) {
	pre := snapshot(ctx)
	c.resp, c.herr = c.next(ctx, c.req)
	code := connect.Code(0)
	if c.herr != nil {
		code = connect.CodeOf(c.herr)
	}
	if c.h.o.OutcomeFunc(code) == idem.OutcomeRelease {
		if c.herr == nil {
			return nil, errReleased
		}
		return nil, c.herr
	}
	if c.herr != nil {
		return encodeError(ctx, c.herr, pre)
	}
	return encodeReply(ctx, c.resp, pre)
}

// answer turns the executor's result into the call's reply or error.
func (c *call) answer(ctx context.Context, res *idem.Result, err error) (connect.AnyResponse, error) {
	expires := time.Time{}
	if !res.ExpiresAt.IsZero() && !res.Released {
		expires = res.ExpiresAt
	}
	switch {
	case err == nil && res.Replayed:
		r, derr := decode(res.Response, c.req.Spec())
		markReplay(ctx, r, derr, "true", expires)
		return r, derr
	case err == nil && c.herr != nil:
		// A stored error, on its first execution: sent as the handler
		// returned it, with idem's headers beside it.
		markReplay(ctx, nil, nil, "false", expires)
		return nil, c.herr
	case err == nil:
		markReplay(ctx, c.resp, nil, "false", expires)
		return c.resp, nil
	case errors.Is(err, errReleased):
		return c.resp, nil
	}
	if a, ok := rpcidem.ExecAnswer(err); ok {
		return nil, c.h.answer(a, expires)
	}
	// The handler's own error (or one encoding its reply), released so that
	// a retry runs again.
	return nil, err
}

// markReplay sets idem's response headers: on the handler's call info when
// there is one (the handler's own reply or error is never modified: an
// error may be a shared value), otherwise on a reply or error idemconnect
// built itself.
func markReplay(ctx context.Context, r connect.AnyResponse, built error, replayed string, expires time.Time) {
	var h interface{ Set(string, string) }
	if info, ok := connect.CallInfoForHandlerContext(ctx); ok {
		h = info.ResponseHeader()
	} else if r != nil {
		h = r.Header()
	} else if ce := new(connect.Error); errors.As(built, &ce) {
		h = ce.Meta()
	} else {
		return
	}
	h.Set(HeaderReplayed, replayed)
	if !expires.IsZero() {
		h.Set(HeaderExpiresAt, expires.UTC().Format(time.RFC3339))
	}
}

// NewKey returns a fresh idempotency key: 26 random base32 characters (130
// bits), as the client interceptor generates them.
func NewKey() string { return rand.Text() }
