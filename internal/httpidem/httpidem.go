// Package httpidem lets an HTTP framework that is not net/http (Fiber, on
// fasthttp) drive the engine of an idem.Middleware: key parsing,
// fingerprints, the claim and its answers, problems, recording and replay.
// The framework's adapter presents each protected request as an Exchange;
// the engine, which lives in package idem beside the Executor it runs on,
// does the rest, exactly as it does for net/http (idem.Middleware.Handle
// drives the same engine through an Exchange of its own).
//
// Nothing here is part of idem's API. It is imported by other modules of the
// repository, which may be built against a newer core than they were
// released with, so its exported names only ever grow: never change or
// remove one.
package httpidem

import (
	"context"
	"errors"
	"time"

	"github.com/idemhq/idem/idemstore"
)

// ErrBodyTooLarge is returned by Request.Body for a body over its limit;
// the engine answers it with 413 idempotency.request_too_large.
var ErrBodyTooLarge = errors.New("httpidem: request body too large")

// Request is what the engine reads of a protected request.
type Request interface {
	// Context is the request's context: the execution's context derives
	// from it.
	Context() context.Context
	// Method is the request's method.
	Method() string
	// Operation names the operation the request invokes, and reports
	// whether the name is a route pattern (a bounded set, whose scopes
	// the engine may cache).
	Operation() (name string, routed bool)
	// Target is the request target: the path and query as sent.
	Target() string
	// Header returns the values of the request header field name, which
	// is given in canonical form.
	Header(name string) []string
	// Body returns the whole request body, or ErrBodyTooLarge if it is
	// longer than limit bytes. The handler must still be able to read it.
	Body(limit int64) ([]byte, error)
	// Tenant returns the request's tenant ("" for one scope for
	// everyone); an error is answered as idem.Config.TenantFunc's is.
	Tenant() (string, error)
	// Payload returns what to fingerprint instead of the body, as
	// idem.Config.FingerprintFunc does; (nil, nil) fingerprints the body.
	Payload(body []byte) ([]byte, error)
}

// Response is how the engine answers.
type Response interface {
	// SetHeader sets a response header field of idem's own
	// (Idempotency-Key, Idempotency-Replayed,
	// Idempotency-Key-Expires-At) on whatever response is sent; a later
	// call for the same name replaces the earlier value. values must not
	// be modified or kept beyond the call's effect.
	SetHeader(name string, values []string)
	// Write sends a response. With replayed, resp is a stored response:
	// its status, its header fields (except idem's own, set through
	// SetHeader) and its body. Otherwise resp is what the handler's run
	// (Exchange.Run) recorded, and the handler's response goes out as the
	// handler produced it.
	Write(resp *idemstore.Response, replayed bool)
	// Problem sends one of idem's error responses; p is an *idem.Problem
	// whose Type is set.
	Problem(p error)
}

// Exchange is one protected request and its response, as the adapter of a
// framework presents it to the engine.
type Exchange interface {
	Request
	Response
	// Run runs the handler under the execution's context ctx, which the
	// handler must see as its request's context, and returns what the
	// handler produced: its status, every header field it set (the engine
	// leaves out those never stored) and its body, or a response marked
	// Unreplayable if it streamed it. The engine stores a body over
	// idem.Config.MaxResponseBody as Unreplayable too. expiresAt is when
	// the record expires, for a response that is sent while it is
	// produced.
	Run(ctx context.Context, expiresAt time.Time) (*idemstore.Response, error)
	// Sent reports, after Run, that the handler's response has already
	// been sent (it streamed): nothing more can be written.
	Sent() bool
	// Pass runs the handler without idem, as idem.Config.FailOpen wants
	// when the store is unavailable.
	Pass()
}

// Engine is the HTTP engine of one idem.Middleware.
type Engine interface {
	// Protects reports whether a request goes through idem
	// (idem.Config.Requirement); one that does not goes straight to the
	// handler.
	Protects(r Request) bool
	// Serve serves a protected request.
	Serve(x Exchange)
	// NetHTTPOnly names a field of the middleware's idem.Config that only a
	// net/http request can satisfy (TenantFunc, OperationFunc,
	// FingerprintFunc, ErrorFunc), or is "" if none is set: an adapter for
	// another framework refuses such a middleware.
	NetHTTPOnly() string
}

// EngineOf returns the Engine of m, which must be an *idem.Middleware, and
// nil for anything else. Package idem sets it as it is initialised, before
// any package that imports idem runs.
var EngineOf func(m any) Engine
