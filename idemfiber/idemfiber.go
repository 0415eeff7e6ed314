// Package idemfiber is idem's middleware for Fiber
// (github.com/gofiber/fiber/v3): the same contract as idem.Middleware
// (keys, fingerprints, replays byte for byte, 409/422 problems, fail
// closed), for routes of a Fiber app. It runs on Fiber's own request and
// response: no net/http adaptor sits on the request path.
//
//	mw, err := idem.NewMiddleware(store, nil)
//	...
//	idem, err := idemfiber.New(mw, nil)
//	...
//	app := fiber.New()
//	app.Post("/orders", idem, createOrder)
//
// The handlers after the middleware run at most once per key. Their
// response, written through the fiber.Ctx as usual, is stored and sent; a
// retry replays its status, header fields and body without running them.
// An error a handler returns goes through the app's ErrorHandler first, so
// that the response it makes is what is stored (or released, by the
// outcome policy: 5xx by default).
//
// The execution travels in the context of the fiber.Ctx (c.Context()):
// idem.InfoFromContext(c.Context()) returns the key and scope, and on a
// transactional store (sqlitestore, pgstore) a handler asks for its
// transaction with sqlitestore.Tx(c.Context()) or pgstore.Tx, so that its
// writes commit together with the stored response.
//
// The operation that names a record defaults to the method and Fiber's
// route pattern (such as "POST /orders/:id"), so that every order of one
// route shares the route's rules and the same key on two routes names two
// records. Register the middleware on the route, as above: in app.Use the
// route is the Use prefix, and the operation falls back to the method and
// the request path. Config.OperationFunc overrides it.
//
// idem.Config's fields that take a net/http request (TenantFunc,
// OperationFunc, FingerprintFunc, ErrorFunc) cannot see a Fiber request:
// New refuses a middleware that sets one; this package's Config has the
// Fiber forms.
package idemfiber

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/internal/httpidem"
)

// Config holds the Fiber forms of idem.Config's request hooks. A nil
// *Config means all defaults.
type Config struct {
	// TenantFunc returns the tenant or principal a request belongs to, as
	// idem.Config.TenantFunc does. Defaults to a single scope for
	// everyone.
	TenantFunc func(c fiber.Ctx) (string, error)

	// OperationFunc names the operation a request invokes. Defaults to the
	// method and the route pattern.
	OperationFunc func(c fiber.Ctx) string

	// FingerprintFunc returns the payload to fingerprint instead of the
	// body, as idem.Config.FingerprintFunc does. Defaults to the body.
	FingerprintFunc func(c fiber.Ctx, body []byte) ([]byte, error)

	// ErrorFunc writes every error response idem produces. Defaults to
	// application/problem+json, with the same body and header fields as
	// idem.WriteProblem.
	ErrorFunc func(c fiber.Ctx, p *idem.Problem) error
}

// New returns a Fiber handler that runs the rest of the chain under m. When
// m answers without running the chain (a replay, 400, 409, 422, 503), the
// chain does not run. It refuses a middleware whose idem.Config sets a
// field that takes a net/http request.
func New(m *idem.Middleware, cfg *Config) (fiber.Handler, error) {
	if m == nil {
		return nil, errors.New("idemfiber: nil middleware")
	}
	eng := httpidem.EngineOf(m)
	if name := eng.NetHTTPOnly(); name != "" {
		return nil, fmt.Errorf("idemfiber: idem.Config.%s takes a net/http request, which a Fiber request is not; set idemfiber.Config.%s instead", name, name)
	}
	if cfg == nil {
		cfg = &Config{}
	}
	ops := &operations{}
	return func(c fiber.Ctx) error {
		x := &exchange{c: c, cfg: cfg, ops: ops}
		if !eng.Protects(x) {
			return c.Next()
		}
		eng.Serve(x)
		x.applyFields()
		return x.err
	}, nil
}

// exchange is one protected Fiber request and its response, as idem's
// engine drives it (httpidem.Exchange).
type exchange struct {
	c   fiber.Ctx
	cfg *Config
	ops *operations
	// one holds a header field's value, when it has one: the key's in
	// one[0], any other's in one[1] (see Header).
	one [2]string
	// fields are idem's own response header fields, set on whatever
	// response goes out once the engine is done (applyFields).
	fields [3]field
	// err is what the middleware returns to Fiber: an error of a chain
	// that ran without idem (FailOpen) or of ErrorFunc.
	err error
}

type field struct {
	name  string
	value string
}

var _ httpidem.Exchange = (*exchange)(nil)

func (x *exchange) Context() context.Context { return x.c.Context() }

func (x *exchange) Method() string { return x.c.Method() }

// Operation returns Config.OperationFunc's name, or the method and the
// route pattern, or without one (in app.Use) the method and the path.
// Fiber's strings may be views of its request buffer: every name is a
// fresh string, since the scope made of it is stored.
func (x *exchange) Operation() (string, bool) {
	if x.cfg.OperationFunc != nil {
		return strings.Clone(x.cfg.OperationFunc(x.c)), false
	}
	method := x.c.Method()
	if r := x.c.Route(); r != nil && r.Method != "USE" && r.Path != "" {
		return x.ops.name(method, r), true
	}
	return method + " " + x.c.Path(), false
}

// operations caches the operation name of each route and method: their
// number is bounded by the app's routes, and one shared string per route
// saves an allocation per request.
type operations struct{ names sync.Map }

type routeMethod struct {
	route  *fiber.Route
	method string
}

func (o *operations) name(method string, r *fiber.Route) string {
	k := routeMethod{r, method}
	if n, ok := o.names.Load(k); ok {
		return n.(string)
	}
	n := method + " " + r.Path
	o.names.Store(routeMethod{r, strings.Clone(method)}, n)
	return n
}

func (x *exchange) Target() string { return x.c.OriginalURL() }

// Header returns copies of the field's values: the key is stored. A single
// value is handed out in x.one, which saves the slice's allocation; the
// engine reads the key's before it asks for another field.
func (x *exchange) Header(name string) []string {
	raw := x.c.Request().Header.PeekAll(name)
	switch len(raw) {
	case 0:
		return nil
	case 1:
		i := 1
		if name == idem.HeaderKey {
			i = 0
		}
		x.one[i] = string(raw[0])
		return x.one[i : i+1 : i+1]
	}
	vs := make([]string, len(raw))
	for i, v := range raw {
		vs[i] = string(v)
	}
	return vs
}

// Body returns the body as received (not decoded): Fiber has read it
// already, within its own BodyLimit.
func (x *exchange) Body(limit int64) ([]byte, error) {
	b := x.c.Request().Body()
	if int64(len(b)) > limit {
		return nil, httpidem.ErrBodyTooLarge
	}
	return b, nil
}

func (x *exchange) Tenant() (string, error) {
	if x.cfg.TenantFunc == nil {
		return "", nil
	}
	t, err := x.cfg.TenantFunc(x.c)
	return strings.Clone(t), err
}

func (x *exchange) Payload(body []byte) ([]byte, error) {
	if x.cfg.FingerprintFunc == nil {
		return nil, nil
	}
	return x.cfg.FingerprintFunc(x.c, body)
}

func (x *exchange) SetHeader(name string, values []string) {
	for i := range x.fields {
		if f := &x.fields[i]; f.name == "" || f.name == name {
			f.name, f.value = name, values[0]
			return
		}
	}
}

// applyFields sets idem's own header fields on the response.
func (x *exchange) applyFields() {
	h := &x.c.Response().Header
	for _, f := range x.fields {
		if f.name != "" {
			h.Set(f.name, f.value)
		}
	}
}

// Run runs the rest of the chain with the execution's context as the
// fiber.Ctx's, and returns what it wrote. An error the chain returns is
// turned into its response by the app's ErrorHandler, as Fiber would after
// the chain, so that the response is what is recorded.
func (x *exchange) Run(ctx context.Context, _ time.Time) (*idemstore.Response, error) {
	c := x.c
	prev := c.Context()
	c.SetContext(ctx)
	err := c.Next()
	c.SetContext(prev)
	if err != nil {
		if herr := c.App().ErrorHandler(c, err); herr != nil {
			return nil, herr
		}
	}
	resp := c.Response()
	out := &idemstore.Response{StatusCode: resp.StatusCode()}
	if resp.IsBodyStream() {
		// A streamed body is sent as it is produced: it cannot be stored.
		out.Unreplayable = true
		return out, nil
	}
	// One backing array holds every value: a field with one value (most
	// of them) costs no slice of its own.
	n := 0
	for range resp.Header.All() {
		n++
	}
	out.Header = make(http.Header, n)
	values := make([]string, 0, n)
	for k, v := range resp.Header.All() {
		name := http.CanonicalHeaderKey(string(k))
		values = append(values, string(v))
		if vs, ok := out.Header[name]; ok {
			out.Header[name] = append(vs, values[len(values)-1])
		} else {
			out.Header[name] = values[len(values)-1 : len(values) : len(values)]
		}
	}
	out.Body = bytes.Clone(resp.Body())
	return out, nil
}

// Sent is false: Fiber sends the response after the handlers return, so
// idem may always replace it.
func (x *exchange) Sent() bool { return false }

// Write leaves the chain's own response in place, or replaces it with a
// stored one.
func (x *exchange) Write(resp *idemstore.Response, replayed bool) {
	if !replayed {
		return
	}
	r := x.c.Response()
	r.Reset()
	r.SetStatusCode(resp.StatusCode)
	// fasthttp adds a Content-Type of its own unless told not to: a
	// replay carries exactly the stored fields.
	r.Header.SetNoDefaultContentType(true)
	for k, vs := range resp.Header {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	r.SetBody(resp.Body)
}

// Problem replaces whatever response there is with the problem.
func (x *exchange) Problem(err error) {
	p := err.(*idem.Problem)
	r := x.c.Response()
	r.Reset()
	if x.cfg.ErrorFunc != nil {
		x.err = x.cfg.ErrorFunc(x.c, p)
		return
	}
	var w problemWriter
	w.header = make(http.Header)
	idem.WriteProblem(&w, p)
	r.SetStatusCode(w.status)
	for k, vs := range w.header {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	r.SetBody(w.body)
}

// Pass runs the rest of the chain without idem (idem.Config.FailOpen).
func (x *exchange) Pass() { x.err = x.c.Next() }

// problemWriter collects what idem.WriteProblem writes, so that a Fiber
// response gets the same status, header fields and body.
type problemWriter struct {
	header http.Header
	status int
	body   []byte
}

func (w *problemWriter) Header() http.Header  { return w.header }
func (w *problemWriter) WriteHeader(code int) { w.status = code }
func (w *problemWriter) Write(p []byte) (int, error) {
	w.body = append(w.body, p...)
	return len(p), nil
}
