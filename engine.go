package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemhq/idem/canonjson"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/internal/httpidem"
)

// The HTTP engine: what the middleware does with a protected request,
// whatever the framework. A framework's adapter presents the request as an
// httpidem.Exchange (net/http's is httpExchange, in middleware.go;
// idemfiber's is Fiber's); the engine parses the key, fingerprints the
// request, claims, runs the handler through the exchange and answers.

func init() {
	httpidem.EngineOf = func(m any) httpidem.Engine {
		mw, _ := m.(*Middleware)
		if mw == nil {
			return nil
		}
		return engine{mw}
	}
}

// engine is a Middleware as httpidem sees it.
type engine struct{ m *Middleware }

func (g engine) Protects(r httpidem.Request) bool { return g.m.protects(r) }

func (g engine) Serve(x httpidem.Exchange) { g.m.serve(x, &exchange{}) }

func (g engine) NetHTTPOnly() string { return g.m.netHTTPOnly }

// netHTTPOnly names the first field of c that only a net/http request can
// satisfy, or is "" if none is set.
func netHTTPOnly(c *Config) string {
	switch {
	case c == nil:
		return ""
	case c.TenantFunc != nil:
		return "TenantFunc"
	case c.OperationFunc != nil:
		return "OperationFunc"
	case c.FingerprintFunc != nil:
		return "FingerprintFunc"
	case c.ErrorFunc != nil:
		return "ErrorFunc"
	}
	return ""
}

// protects reports whether r goes through idem (Config.Requirement).
func (m *Middleware) protects(r httpidem.Request) bool {
	switch m.cfg.Requirement {
	case KeyByMethod:
		return slices.Contains(m.cfg.RequiredMethods, r.Method())
	case KeyRequired:
		return true
	case KeyOptional:
		return len(r.Header(m.cfg.KeyHeader)) > 0
	}
	return false
}

// exchange is the engine's state for one protected request: the exchange
// it answers through, the values of the three idempotency header fields
// (Idempotency-Replayed, Idempotency-Key, Idempotency-Key-Expires-At), and
// the executor's Result, in one allocation (net/http's httpExchange holds it
// too). Each field value is handed out as a full slice expression of
// fields, so that appending to one copies instead of touching another.
// Like the scope cache (see scope), this saves allocations that the
// benchmark showed to matter: together 0.8–1.0 µs of CPU per first
// execution on memstore (docs/BENCHMARKS.md).
type exchange struct {
	m      *Middleware
	x      httpidem.Exchange
	fields [3]string
	// ran reports that the handler ran under the claim.
	ran bool
	res Result
}

// serve handles a protected request: it prepares the request, runs the
// handler at most once through the executor, and answers.
func (m *Middleware) serve(x httpidem.Exchange, ex *exchange) {
	start := m.cfg.NowFunc()
	ex.m, ex.x = m, x
	ex.fields[0] = "false"
	x.SetHeader(HeaderReplayed, ex.fields[0:1:1])
	p, problem := ex.prepare()
	if problem != nil {
		m.exec.emit(x.Context(), Event{Kind: EventRejected, Operation: p.Operation, Status: problem.Status, Code: problem.Code}, start)
		ex.problem(problem)
		return
	}
	res, err := m.exec.do(x.Context(), p, ex, start, &ex.res)
	ex.answer(res, err)
}

// run is the operation: the handler, through the exchange.
func (ex *exchange) run(ctx context.Context) (*Response, error) {
	ex.ran = true
	info, _ := InfoFromContext(ctx)
	resp, err := ex.x.Run(ctx, info.ExpiresAt)
	switch {
	case resp == nil || resp.Unreplayable:
	case len(resp.Body) > ex.m.cfg.MaxResponseBody:
		// A transport that buffers whole responses (Fiber) sends this one
		// in full; it is too large to store, and must not run again.
		resp = &Response{StatusCode: resp.StatusCode, Unreplayable: true}
	default:
		resp.Header = ex.m.storedHeader(resp.Header)
	}
	return resp, err
}

// prepare checks the request's key and body and returns what identifies
// its execution, or the problem to answer instead. Nothing is claimed yet.
// Once the key is valid it is echoed on the response.
func (ex *exchange) prepare() (DoParams, *Problem) {
	m, x := ex.m, ex.x
	op, routed := x.Operation()
	p := DoParams{Operation: op}
	kh := m.cfg.KeyHeader
	values := x.Header(kh)
	key, err := ParseKey(values)
	if errors.Is(err, ErrKeyMissing) {
		return p, newProblem(http.StatusBadRequest, CodeKeyMissing, kh+" header is required",
			"This operation requires an "+kh+" header; send a unique value (such as a UUID) and reuse it on every retry of the same request.")
	}
	if err == nil && m.cfg.ValidateKeyFunc != nil {
		if verr := m.cfg.ValidateKeyFunc(key); verr != nil {
			err = fmt.Errorf("%w: %v", ErrKeyInvalid, verr)
		}
	}
	if err != nil {
		return p, newProblem(http.StatusBadRequest, CodeKeyInvalid, kh+" header is invalid", err.Error())
	}
	ex.fields[1] = values[0]
	if len(values[0]) != len(key)+2 || values[0][0] != '"' {
		ex.fields[1] = FormatKey(key) // not in the canonical quoted form as received
	}
	x.SetHeader(kh, ex.fields[1:2:2])
	p.Key = key

	body, problem := m.readBody(x)
	if problem != nil {
		return p, problem
	}
	tenant, err := x.Tenant()
	if err != nil {
		return p, asProblem(err, CodeScopeInvalid, "The request's scope cannot be determined")
	}
	p.Scope = m.scope(tenant, p.Operation, routed)
	if p.Fingerprint, p.Payload, err = m.fingerprint(x, p.Operation, body); err != nil {
		return p, asProblem(err, CodeBodyInvalid, "The request body is invalid")
	}
	return p, nil
}

// answer sends the outcome of the execution: the handler's response
// (already sent if it streamed), a replay, or a problem.
func (ex *exchange) answer(res *Result, err error) {
	m, x := ex.m, ex.x
	if !res.ExpiresAt.IsZero() && !res.Released {
		ex.fields[2] = m.expiry.format(res.ExpiresAt)
		x.SetHeader(HeaderExpiresAt, ex.fields[2:3:3])
	}
	if ex.ran && x.Sent() {
		return // already sent as it was produced
	}
	switch {
	case err == nil && res.Replayed:
		ex.fields[0] = "true"
		x.SetHeader(HeaderReplayed, ex.fields[0:1:1])
		x.Write(res.Response, true)
	case err == nil:
		x.Write(res.Response, false)
	case errors.Is(err, ErrStoreUnavailable) && !ex.ran && m.cfg.FailOpen:
		x.Pass()
	default:
		p := m.problemFor(err, res)
		if p == nil && (errors.Is(err, errClientGone) || x.Context().Err() != nil) {
			return // nobody is listening; the key was released (or never claimed)
		}
		if p == nil {
			p = newProblem(http.StatusInternalServerError, "idempotency.internal_error", "Internal error", "")
		}
		ex.problem(p)
	}
}

// problem sends one of idem's error responses. A problem with one of idem's
// codes and no Type of its own gets the type URI of its code under
// Config.ProblemBaseURL.
func (ex *exchange) problem(p *Problem) {
	if p.Type == "" && strings.HasPrefix(p.Code, "idempotency.") {
		p.Type = ex.m.cfg.ProblemBaseURL + p.Code
	}
	ex.x.Problem(p)
}

// problemFor returns the problem that answers an error of Executor.Do, or
// nil for an error that is not the executor's own.
func (m *Middleware) problemFor(err error, res *Result) *Problem {
	retryAfter := m.cfg.retryAfterSeconds()
	switch {
	case errors.Is(err, idemstore.ErrInFlight):
		return &Problem{Status: http.StatusConflict, Code: CodeRequestInProgress,
			Title:      "A request with this Idempotency-Key is in progress",
			Detail:     "An earlier request with the same key has not finished yet; retry after the indicated delay to receive its response.",
			RetryAfter: retryAfter}
	case errors.Is(err, ErrFingerprintMismatch):
		return newProblem(http.StatusUnprocessableEntity, CodeKeyReused,
			"Idempotency-Key is already used with a different request",
			"This key was used for a request with a different method, operation or payload; use a new key for a new request.")
	case errors.Is(err, ErrResponseUnavailable):
		p := newProblem(http.StatusConflict, CodeResponseUnavailable,
			"The request was already executed; its response cannot be replayed",
			fmt.Sprintf("The request with this key completed with status %d, but its response was too large or streamed and was not stored. It will not be executed again with this key.", res.Response.StatusCode))
		p.Extensions = map[string]any{"originalStatus": res.Response.StatusCode}
		return p
	case errors.Is(err, idemstore.ErrLeaseLost):
		return &Problem{Status: http.StatusServiceUnavailable, Code: CodeLeaseLost,
			Title:      "The request lost its claim on the Idempotency-Key",
			Detail:     "Another attempt took over this key while the request ran; its result was discarded. Retry with the same key to receive the outcome.",
			RetryAfter: retryAfter}
	case errors.Is(err, ErrRecordUnreadable):
		return &Problem{Status: http.StatusServiceUnavailable, Code: CodeRecordUnreadable,
			Title:      "The stored record for this Idempotency-Key cannot be read",
			Detail:     "The request was already executed, in whole or in part, but what was stored for it cannot be decrypted here. It will not be executed again with this key; retry later.",
			RetryAfter: retryAfter}
	case errors.Is(err, ErrStoreUnavailable):
		return &Problem{Status: http.StatusServiceUnavailable, Code: CodeStoreUnavailable,
			Title:      "The idempotency store is unavailable",
			Detail:     "The request was not executed because its Idempotency-Key could not be recorded; retry with the same key.",
			RetryAfter: retryAfter}
	}
	return nil
}

// scope returns the record scope of a request. The scopes of requests
// with no tenant are cached: sharing one string per operation saves an
// allocation per request and, on memstore, an object per stored record,
// which the collector marks on every cycle (see exchange for what such
// allocations measured). The operations named by their route pattern are
// bounded by the router's patterns; the others (method and path) are not,
// so at most maxUnroutedScopes of them are cached, the first ones seen.
func (m *Middleware) scope(tenant, op string, routed bool) string {
	if tenant != "" {
		return Scope(tenant, op)
	}
	if s, ok := m.scopes.Load(op); ok {
		return s.(string)
	}
	s := Scope("", op)
	if routed || m.unrouted.Add(1) <= maxUnroutedScopes {
		m.scopes.Store(op, s)
	}
	return s
}

// maxUnroutedScopes bounds the scopes cached for requests without a route
// pattern: a few dozen kilobytes.
const maxUnroutedScopes = 256

// isIdemField reports whether k is one of the fields idem sets itself.
func isIdemField(k string) bool {
	return k == HeaderKey || k == HeaderReplayed || k == HeaderExpiresAt
}

// readBody reads the whole request body, within MaxRequestBody.
func (m *Middleware) readBody(x httpidem.Request) ([]byte, *Problem) {
	limit := m.cfg.MaxRequestBody
	body, err := x.Body(limit)
	switch {
	case errors.Is(err, httpidem.ErrBodyTooLarge):
		return nil, newProblem(http.StatusRequestEntityTooLarge, CodeRequestTooLarge, "Request body too large",
			fmt.Sprintf("Requests to this operation may carry at most %d bytes.", limit))
	case err != nil:
		return nil, newProblem(http.StatusBadRequest, CodeBodyInvalid, "The request body could not be read", err.Error())
	}
	return body, nil
}

// fingerprint returns the request's fingerprint and the payload the
// application's FingerprintFunc chose, if any.
func (m *Middleware) fingerprint(x httpidem.Request, op string, body []byte) (string, []byte, error) {
	in := FingerprintInput{Method: x.Method(), Operation: op, Target: x.Target(), Body: body}
	if ct := x.Header("Content-Type"); len(ct) > 0 {
		in.ContentType = ct[0]
	}
	payload, err := x.Payload(body)
	if err != nil {
		return "", nil, err
	}
	if payload != nil {
		in.Body, in.Payload = payload, true
	}
	if m.fields != nil && !in.Payload && len(body) > 0 {
		if _, isJSON := normaliseMediaType(in.ContentType); isJSON {
			// The canonicaliser checks the body first: it is stricter
			// than encoding/json, which selects the fields.
			if _, err := canonjson.Append(nil, body); err != nil {
				return "", nil, err
			}
			selected, err := m.fields.apply(body)
			if err != nil {
				return "", nil, err
			}
			in.Body = selected
		}
	}
	fp, err := Fingerprint(in)
	return fp, payload, err
}

// asProblem returns err itself if it is a *Problem, or a 400 problem with
// the given code whose detail is err's text.
func asProblem(err error, code, title string) *Problem {
	var p *Problem
	if errors.As(err, &p) {
		return p
	}
	return newProblem(http.StatusBadRequest, code, title, err.Error())
}

func formatExpiry(t time.Time) string {
	return t.UTC().Format(time.RFC3339)
}

// expiryCache holds the last Idempotency-Key-Expires-At value formatted.
// The value has a resolution of one second, and every first execution
// within a second (most of a busy service's) expires within the same one:
// sharing its text saves an allocation per request (docs/BENCHMARKS.md).
type expiryCache struct{ last atomic.Pointer[expiryText] }

type expiryText struct {
	unix int64
	text string
}

// format returns formatExpiry(t).
func (c *expiryCache) format(t time.Time) string {
	sec := t.Unix()
	if e := c.last.Load(); e != nil && e.unix == sec {
		return e.text
	}
	e := &expiryText{unix: sec, text: formatExpiry(t)}
	c.last.Store(e)
	return e.text
}

// storedHeader returns the header fields of a handler's response that are
// stored: all but those never stored (Middleware.deny, and those the
// Connection field names). The handler has returned, so h is ours to keep;
// it is copied only when some field must be left out.
func (m *Middleware) storedHeader(h http.Header) http.Header {
	conn := h["Connection"]
	for k := range h {
		if m.deny[k] || listsToken(conn, k) {
			stored := make(http.Header, len(h))
			for k, vs := range h {
				if !m.deny[k] && !listsToken(conn, k) {
					stored[k] = vs
				}
			}
			return stored
		}
	}
	return h
}

// listsToken reports whether a Connection field names the header field k,
// which makes k hop-by-hop too.
func listsToken(conn []string, k string) bool {
	for _, v := range conn {
		for _, tok := range bytes.Split([]byte(v), []byte{','}) {
			if textproto.CanonicalMIMEHeaderKey(string(bytes.TrimSpace(tok))) == k {
				return true
			}
		}
	}
	return false
}
