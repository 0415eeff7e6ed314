package idem

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemhq/idem/canonjson"
	"github.com/idemhq/idem/idemstore"
)

// Middleware makes HTTP handlers safe to retry: see the package
// documentation and docs/semantics.md for the contract it implements.
type Middleware struct {
	exec *Executor
	cfg  *Config
	// deny holds the canonical names of the header fields never stored.
	deny map[string]bool
	// fields is Config.FingerprintInclude/Exclude, parsed; nil without.
	fields *fieldSelection
	// scopes caches the record scope of each ServeMux pattern (see scope).
	scopes sync.Map
}

// NewMiddleware returns a Middleware that keeps its records in store. A nil
// cfg means all defaults. Several middlewares (for routes with different
// settings) may share one store.
func NewMiddleware(store idemstore.Store, cfg *Config) (*Middleware, error) {
	exec, err := newExecutor(store, cfg)
	if err != nil {
		return nil, err
	}
	m := &Middleware{exec: exec, cfg: &exec.cfg, deny: map[string]bool{}}
	if m.fields, err = newFieldSelection(m.cfg.FingerprintInclude, m.cfg.FingerprintExclude); err != nil {
		return nil, err
	}
	for _, h := range hopByHop {
		m.deny[h] = true
	}
	for _, h := range []string{"Date", HeaderKey, m.cfg.KeyHeader, HeaderReplayed, HeaderExpiresAt} {
		m.deny[h] = true
	}
	for _, h := range m.cfg.ReplayDenyHeaders {
		m.deny[textproto.CanonicalMIMEHeaderKey(h)] = true
	}
	return m, nil
}

// hopByHop are the connection-specific fields of RFC 9110 section 7.6.1,
// never stored or replayed.
var hopByHop = []string{
	"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer",
	"Transfer-Encoding", "Upgrade", "Proxy-Authenticate", "Proxy-Authorization",
}

// Handle wraps next so that requests needing a key run at most once per key.
func (m *Middleware) Handle(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.protects(r) {
			next.ServeHTTP(w, r)
			return
		}
		m.serve(w, r, next)
	})
}

// protects reports whether r goes through idem (Config.Requirement).
func (m *Middleware) protects(r *http.Request) bool {
	switch m.cfg.Requirement {
	case KeyByMethod:
		return slices.Contains(m.cfg.RequiredMethods, r.Method)
	case KeyRequired:
		return true
	case KeyOptional:
		return len(r.Header[m.cfg.KeyHeader]) > 0
	}
	return false
}

// errClientGone releases the key when the client disconnected and the
// handler wrote nothing: there is no outcome worth storing.
var errClientGone = errors.New("idem: client went away before the handler answered")

// serve handles a protected request: it prepares the request, runs next at
// most once through the executor, and answers.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	start := m.cfg.NowFunc()
	ex := &exchange{}
	ex.fields[0] = "false"
	w.Header()[HeaderReplayed] = ex.fields[0:1:1]
	p, problem := m.prepare(w, r, ex)
	if problem != nil {
		m.exec.emit(r.Context(), Event{Kind: EventRejected, Operation: p.Operation, Status: problem.Status, Code: problem.Code}, start)
		m.writeProblem(w, r, problem)
		return
	}
	// rec is set when the handler runs.
	var rec *recorder
	ex.call.init(m.exec, r.Context(), p, func(ctx context.Context) (*Response, error) {
		info, _ := InfoFromContext(ctx)
		rec = &ex.rec
		*rec = recorder{w: w, m: m, limit: m.cfg.MaxResponseBody, header: make(http.Header), expiresAt: info.ExpiresAt}
		next.ServeHTTP(rec, r.WithContext(ctx))
		if !rec.wroteHeader && r.Context().Err() != nil {
			return nil, errClientGone
		}
		return rec.response(), nil
	}, start)
	res, err := ex.call.run()
	m.answer(w, r, next, ex, rec, res, err)
}

// exchange is the middleware's state for one protected request, in one
// allocation: the body handed to the handler, the recorder of its response,
// the executor's result, and the values of the three idempotency header
// fields (Idempotency-Replayed, Idempotency-Key, Idempotency-Key-Expires-At).
// Each field is a full slice expression of fields, so that appending to one
// copies instead of touching another. Like the scope cache (see scope), this
// saves allocations that the benchmark showed to matter: together 0.8–1.0 µs
// of CPU per first execution on memstore (docs/BENCHMARKS.md).
type exchange struct {
	body   replayBody
	rec    recorder
	call   call
	fields [3]string
}

// prepare checks the request's key and body and returns what identifies
// its execution, or the problem to answer instead. Nothing is claimed yet.
// Once the key is valid it is echoed on the response; the body the handler
// will read is put in ex.
func (m *Middleware) prepare(w http.ResponseWriter, r *http.Request, ex *exchange) (DoParams, *Problem) {
	p := DoParams{Operation: m.operation(r)}
	kh := m.cfg.KeyHeader
	values := r.Header[kh]
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
	w.Header()[kh] = ex.fields[1:2:2]
	p.Key = key

	body, problem := m.readBody(r, &ex.body)
	if problem != nil {
		return p, problem
	}
	tenant := ""
	if m.cfg.TenantFunc != nil {
		if tenant, err = m.cfg.TenantFunc(r); err != nil {
			return p, asProblem(err, CodeScopeInvalid, "The request's scope cannot be determined")
		}
	}
	p.Scope = m.scope(r, tenant, p.Operation)
	if p.Fingerprint, p.Payload, err = m.fingerprint(r, p.Operation, body); err != nil {
		return p, asProblem(err, CodeBodyInvalid, "The request body is invalid")
	}
	return p, nil
}

// answer sends the outcome of the execution: the handler's response (already
// sent if it streamed), a replay, or a problem.
func (m *Middleware) answer(w http.ResponseWriter, r *http.Request, next http.Handler, ex *exchange, rec *recorder, res *Result, err error) {
	h := w.Header()
	if !res.ExpiresAt.IsZero() && !res.Released {
		ex.fields[2] = formatExpiry(res.ExpiresAt)
		h[HeaderExpiresAt] = ex.fields[2:3:3]
	}
	if rec != nil && rec.streamed {
		return // already sent as it was produced
	}
	switch {
	case err == nil && res.Replayed:
		ex.fields[0] = "true" // the value of the Idempotency-Replayed field set in serve
		writeResponse(w, res.Response, res.Response.Header)
	case err == nil:
		// The handler has returned: its own header values can be sent
		// without copying.
		for k, vs := range rec.header {
			if !isIdemField(k) {
				h[k] = vs
			}
		}
		writeResponse(w, res.Response, nil)
	case errors.Is(err, ErrStoreUnavailable) && rec == nil && m.cfg.FailOpen:
		next.ServeHTTP(w, r)
	default:
		p := m.problemFor(err, res)
		if p == nil && (errors.Is(err, errClientGone) || r.Context().Err() != nil) {
			return // nobody is listening; the key was released (or never claimed)
		}
		if p == nil {
			p = newProblem(http.StatusInternalServerError, "idempotency.internal_error", "Internal error", "")
		}
		m.writeProblem(w, r, p)
	}
}

// writeProblem writes one of idem's error responses with ErrorFunc. A problem
// with one of idem's codes and no Type of its own gets the type URI of its
// code under Config.ProblemBaseURL.
func (m *Middleware) writeProblem(w http.ResponseWriter, r *http.Request, p *Problem) {
	if p.Type == "" && strings.HasPrefix(p.Code, "idempotency.") {
		p.Type = m.cfg.ProblemBaseURL + p.Code
	}
	m.cfg.ErrorFunc(w, r, p)
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

// scope returns the record scope of a request. The scopes of requests routed
// by a ServeMux pattern, with no tenant, are cached: their number is bounded
// by the mux's patterns, and sharing one string per route saves an
// allocation per request and, on memstore, per stored record (see exchange
// for what that measured).
func (m *Middleware) scope(r *http.Request, tenant, op string) string {
	if tenant != "" || r.Pattern == "" || m.cfg.OperationFunc != nil {
		return Scope(tenant, op)
	}
	if s, ok := m.scopes.Load(op); ok {
		return s.(string)
	}
	s := Scope("", op)
	m.scopes.Store(op, s)
	return s
}

// isIdemField reports whether k is one of the fields idem sets itself.
func isIdemField(k string) bool {
	return k == HeaderKey || k == HeaderReplayed || k == HeaderExpiresAt
}

// operation names the operation a request invokes.
func (m *Middleware) operation(r *http.Request) string {
	if m.cfg.OperationFunc != nil {
		return m.cfg.OperationFunc(r)
	}
	if p := r.Pattern; p != "" {
		if len(p) > len(r.Method) && p[len(r.Method)] == ' ' && p[:len(r.Method)] == r.Method {
			return p
		}
		return r.Method + " " + p
	}
	return r.Method + " " + r.URL.Path
}

// readBody reads the whole request body, within MaxRequestBody, and puts a
// replayable copy back for the handler, in rb.
func (m *Middleware) readBody(r *http.Request, rb *replayBody) ([]byte, *Problem) {
	limit := m.cfg.MaxRequestBody
	tooLarge := func() *Problem {
		return newProblem(http.StatusRequestEntityTooLarge, CodeRequestTooLarge, "Request body too large",
			fmt.Sprintf("Requests to this operation may carry at most %d bytes.", limit))
	}
	if r.ContentLength > limit {
		return nil, tooLarge()
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	var body []byte
	var err error
	if r.ContentLength >= 0 {
		// One spare byte of capacity receives the check below.
		body = make([]byte, r.ContentLength, r.ContentLength+1)
		_, err = io.ReadFull(r.Body, body)
		if err == nil {
			// Content-Length is trusted by net/http; a longer body is
			// an error of the server, not ours, but check anyway.
			if n, _ := r.Body.Read(body[len(body):cap(body)]); n > 0 {
				return nil, tooLarge()
			}
		}
	} else {
		body, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
		if err == nil && int64(len(body)) > limit {
			return nil, tooLarge()
		}
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge()
		}
		return nil, newProblem(http.StatusBadRequest, CodeBodyInvalid, "The request body could not be read", err.Error())
	}
	rb.Reset(body)
	r.Body = rb
	return body, nil
}

// fingerprint returns the request's fingerprint and the payload the
// application's FingerprintFunc chose, if any.
func (m *Middleware) fingerprint(r *http.Request, op string, body []byte) (string, []byte, error) {
	in := FingerprintInput{Method: r.Method, Operation: op, Target: r.URL.RequestURI(),
		ContentType: r.Header.Get("Content-Type"), Body: body}
	var payload []byte
	if m.cfg.FingerprintFunc != nil {
		var err error
		if payload, err = m.cfg.FingerprintFunc(r, body); err != nil {
			return "", nil, err
		}
		if payload != nil {
			in.Body, in.Payload = payload, true
		}
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

// writeResponse sends resp with the given header fields (the stored ones on
// a replay) added to those idem already set. The stored value slices are
// shared, capped to their length: a later append by another handler copies
// instead of writing into the store's record. (net/http itself copies the
// header map when the status is written.)
func writeResponse(w http.ResponseWriter, resp *Response, header http.Header) {
	h := w.Header()
	for k, vs := range header {
		if _, ours := h[k]; ours && isIdemField(k) {
			continue
		}
		h[k] = vs[:len(vs):len(vs)]
	}
	w.WriteHeader(resp.StatusCode)
	if len(resp.Body) > 0 {
		_, _ = w.Write(resp.Body)
	}
}

// recorder buffers a handler's response so that it can be stored before it
// is sent. If the body outgrows the limit or the handler flushes or hijacks
// the connection, it switches to passing the response straight through and
// the record completes as unreplayable.
type recorder struct {
	w         http.ResponseWriter
	m         *Middleware
	header    http.Header
	status    int
	buf       []byte
	limit     int
	expiresAt time.Time

	wroteHeader bool
	streamed    bool
}

func (rw *recorder) Header() http.Header { return rw.header }

func (rw *recorder) WriteHeader(code int) {
	if rw.streamed {
		if !rw.wroteHeader {
			rw.wroteHeader = true
			rw.status = code
		}
		rw.w.WriteHeader(code)
		return
	}
	if rw.wroteHeader {
		return
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Informational responses (103 Early Hints) go out at once and are
		// not part of the stored response.
		h := rw.w.Header()
		for k, vs := range rw.header {
			h[k] = vs
		}
		rw.w.WriteHeader(code)
		return
	}
	rw.wroteHeader = true
	rw.status = code
}

func (rw *recorder) Write(p []byte) (int, error) {
	if !rw.wroteHeader {
		rw.WriteHeader(http.StatusOK)
	}
	if rw.streamed {
		return rw.w.Write(p)
	}
	if len(rw.buf)+len(p) > rw.limit {
		if err := rw.stream(); err != nil {
			return 0, err
		}
		return rw.w.Write(p)
	}
	rw.buf = append(rw.buf, p...)
	return len(p), nil
}

// stream sends what was buffered and switches to pass-through.
func (rw *recorder) stream() error {
	if rw.streamed {
		return nil
	}
	rw.streamed = true
	if !rw.wroteHeader {
		rw.wroteHeader = true
		rw.status = http.StatusOK
	}
	h := rw.w.Header()
	for k, vs := range rw.header {
		if !isIdemField(k) {
			h[k] = vs
		}
	}
	if !rw.expiresAt.IsZero() {
		h.Set(HeaderExpiresAt, formatExpiry(rw.expiresAt))
	}
	rw.w.WriteHeader(rw.status)
	if len(rw.buf) > 0 {
		if _, err := rw.w.Write(rw.buf); err != nil {
			return err
		}
	}
	rw.buf = nil
	return nil
}

// Flush implements http.Flusher. A flushed response cannot be stored.
func (rw *recorder) Flush() { _ = rw.FlushError() }

// FlushError is the form http.ResponseController prefers.
func (rw *recorder) FlushError() error {
	if err := rw.stream(); err != nil {
		return err
	}
	return http.NewResponseController(rw.w).Flush()
}

// Hijack implements http.Hijacker. A hijacked connection's response cannot
// be stored; the record completes with status 101 as unreplayable.
func (rw *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(rw.w).Hijack()
	if err == nil {
		rw.streamed = true
		if !rw.wroteHeader {
			rw.wroteHeader = true
			rw.status = http.StatusSwitchingProtocols
		}
	}
	return conn, brw, err
}

// Unwrap lets http.ResponseController reach the underlying writer for the
// features the recorder does not intercept (deadlines, full duplex).
func (rw *recorder) Unwrap() http.ResponseWriter { return rw.w }

// response returns what to store: the buffered response with the
// replayable header fields, or an unreplayable marker.
func (rw *recorder) response() *Response {
	status := rw.status
	if !rw.wroteHeader {
		status = http.StatusOK
	}
	if rw.streamed {
		return &Response{StatusCode: status, Unreplayable: true}
	}
	// The handler has returned, so its header map is ours to keep. It is
	// copied only when some field must not be stored.
	stored := rw.header
	conn := rw.header["Connection"]
	for k := range rw.header {
		if rw.m.deny[k] || listsToken(conn, k) {
			stored = make(http.Header, len(rw.header))
			for k, vs := range rw.header {
				if !rw.m.deny[k] && !listsToken(conn, k) {
					stored[k] = vs
				}
			}
			break
		}
	}
	return &Response{StatusCode: status, Header: stored, Body: rw.buf}
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

// replayBody gives the handler the body idem read, as one allocation. Its
// Len method (from bytes.Reader) is part of its contract: a reverse proxy
// behind the middleware uses it to send a Content-Length upstream for a
// request the client sent chunked.
type replayBody struct{ bytes.Reader }

func (*replayBody) Close() error { return nil }
