package idemgrpc

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Defaults of ClientOptions.
const (
	DefaultMaxAttempts   = 3
	DefaultMaxRetryDelay = 10 * time.Second
)

// ClientOptions configure UnaryClientInterceptor. A nil *ClientOptions
// means all defaults.
type ClientOptions struct {
	// MethodFunc reports whether calls to a method get a key. Defaults to
	// every method.
	MethodFunc func(fullMethod string) bool

	// MaxAttempts bounds the attempts of one call, the first included. A
	// call is retried, with the same key, when it fails with Unavailable
	// (the store or the server was unavailable) or Aborted (another
	// attempt with the key is in progress), until the call's context ends.
	// Defaults to DefaultMaxAttempts (3); 1 disables retries.
	MaxAttempts int

	// MaxRetryDelay bounds the wait between attempts: the server's
	// RetryInfo delay if it sends one, otherwise exponential back-off from
	// 100 ms. Defaults to DefaultMaxRetryDelay (10 seconds).
	MaxRetryDelay time.Duration

	// NewKeyFunc returns a fresh key for a call. Defaults to NewKey.
	NewKeyFunc func() string
}

// UnaryClientInterceptor returns a client interceptor that gives every call
// without an "idempotency-key" metadata entry a fresh key, and retries the
// call with that same key on transient failures, so that the server runs
// it at most once. A key the caller set in the outgoing metadata is kept.
// gRPC's own retry policy (service config), which runs beneath
// interceptors, resends the same metadata and so the same key too.
func UnaryClientInterceptor(opts *ClientOptions) grpc.UnaryClientInterceptor {
	var o ClientOptions
	if opts != nil {
		o = *opts
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
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, callOpts ...grpc.CallOption) error {
		if o.MethodFunc != nil && !o.MethodFunc(method) {
			return invoker(ctx, method, req, reply, cc, callOpts...)
		}
		if md, _ := metadata.FromOutgoingContext(ctx); len(md.Get(MetadataKey)) == 0 {
			ctx = metadata.AppendToOutgoingContext(ctx, MetadataKey, o.NewKeyFunc())
		}
		backoff := 100 * time.Millisecond
		for attempt := 1; ; attempt++ {
			err := invoker(ctx, method, req, reply, cc, callOpts...)
			if err == nil || attempt >= o.MaxAttempts || !retryable(ctx, err) {
				return err
			}
			delay, ok := RetryDelay(err)
			if !ok {
				delay, backoff = backoff, 2*backoff
			}
			delay = min(delay, o.MaxRetryDelay)
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return errors.Join(err, ctx.Err())
			case <-t.C:
			}
		}
	}
}

// retryable reports whether a failed attempt may be retried with its key.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted:
		return true
	}
	return false
}
