package idemconnect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/idemhq/idem"
)

// Defaults of ClientOptions.
const (
	DefaultMaxAttempts   = 3
	DefaultMaxRetryDelay = 10 * time.Second
)

// ClientOptions configure NewClientInterceptor. A nil *ClientOptions means
// all defaults.
type ClientOptions struct {
	// ProcedureFunc reports whether calls to a procedure get a key and
	// retries. Defaults to every procedure whose idempotency level is
	// connect.IdempotencyUnknown (see HandlerOptions.RequireFunc).
	ProcedureFunc func(connect.Spec) bool

	// MaxAttempts bounds the attempts of one call, the first included. A
	// call is retried, with the same key, when it fails with Unavailable
	// (the store or the server was unavailable, or the connection failed)
	// or Aborted (another attempt with the key is in progress). Defaults to
	// DefaultMaxAttempts (3); 1 disables retries.
	MaxAttempts int

	// MaxRetryDelay bounds the wait between attempts: the server's
	// RetryInfo delay if it sends one, otherwise exponential back-off from
	// 100 ms. A wait that would end after the call's deadline is not
	// started: the last error is returned at once. Defaults to
	// DefaultMaxRetryDelay (10 seconds).
	MaxRetryDelay time.Duration

	// NewKeyFunc returns a fresh key for a call, sent as a Structured Field
	// string ("…"). Defaults to NewKey.
	NewKeyFunc func() string
}

// NewClientInterceptor returns an interceptor for Connect clients that
// gives every unary call without an Idempotency-Key header a fresh key, and
// retries the call with that same key on transient failures, so that a
// server running idem runs it at most once. A key the caller set (in the
// request's Header, or through connect.NewClientContext) is kept, so an
// application that retries a call itself, across restarts say, sets its
// own key and reuses it. Install it with connect.WithInterceptors on a
// client; on a handler, its calls fail with Internal. Streaming calls pass
// through untouched.
//
// Retry only against servers that honour the key: without one, a retried
// Unavailable may run twice.
func NewClientInterceptor(opts *ClientOptions) connect.Interceptor {
	var o ClientOptions
	if opts != nil {
		o = *opts
	}
	if o.ProcedureFunc == nil {
		o.ProcedureFunc = func(s connect.Spec) bool { return s.IdempotencyLevel == connect.IdempotencyUnknown }
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.MaxRetryDelay <= 0 {
		o.MaxRetryDelay = DefaultMaxRetryDelay
	}
	if o.NewKeyFunc == nil {
		o.NewKeyFunc = NewKey
	}
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			spec := req.Spec()
			if !spec.IsClient {
				return nil, connect.NewError(connect.CodeInternal,
					errors.New("idemconnect: NewClientInterceptor is installed on a handler; use NewHandlerInterceptor"))
			}
			if !o.ProcedureFunc(spec) {
				return next(ctx, req)
			}
			if len(req.Header().Values(HeaderKey)) == 0 {
				key := quote(o.NewKeyFunc())
				if _, err := idem.ParseKey([]string{key}); err != nil {
					return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: NewKeyFunc: %w", err))
				}
				req.Header().Set(HeaderKey, key)
			}
			return o.retry(ctx, req, next)
		}
	})
}

// retry runs the attempts of one call.
func (o *ClientOptions) retry(ctx context.Context, req connect.AnyRequest, next connect.UnaryFunc) (connect.AnyResponse, error) {
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		resp, err := next(ctx, req)
		if err == nil || attempt >= o.MaxAttempts || ctx.Err() != nil {
			return resp, err
		}
		if c := connect.CodeOf(err); c != connect.CodeUnavailable && c != connect.CodeAborted {
			return resp, err
		}
		delay, ok := RetryDelay(err)
		if !ok {
			delay, backoff = backoff, 2*backoff
		}
		delay = min(delay, o.MaxRetryDelay)
		if d, ok := ctx.Deadline(); ok && time.Until(d) < delay {
			return resp, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return resp, err
		case <-t.C:
		}
	}
}

// quote returns key as a Structured Field string, the form the
// Idempotency-Key draft specifies.
func quote(key string) string {
	var b strings.Builder
	b.Grow(len(key) + 2)
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if key[i] == '"' || key[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}
