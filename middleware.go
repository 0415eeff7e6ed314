package idem

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/internal/httpidem"
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
	// scopes caches the record scope of each route pattern, and of up
	// to maxUnroutedScopes other operations, counted by unrouted (see
	// scope).
	scopes   sync.Map
	unrouted atomic.Int64
	// expiry caches the text of the last expiry sent.
	expiry expiryCache
	// netHTTPOnly names a Config field set that only a net/http request
	// can satisfy (see httpidem.Engine).
	netHTTPOnly string
}

// NewMiddleware returns a Middleware that keeps its records in store. A nil
// cfg means all defaults. Several middlewares (for routes with different
// settings) may share one store.
func NewMiddleware(store idemstore.Store, cfg *Config) (*Middleware, error) {
	exec, err := newExecutor(store, cfg)
	if err != nil {
		return nil, err
	}
	m := &Middleware{exec: exec, cfg: &exec.cfg, deny: map[string]bool{}, netHTTPOnly: netHTTPOnly(cfg)}
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
		if !m.protects(netHTTPRequest{r}) {
			next.ServeHTTP(w, r)
			return
		}
		hx := &httpExchange{netHTTPRequest: netHTTPRequest{r}, next: next, rec: recorder{w: w}}
		m.serve(hx, &hx.ex)
	})
}

// errClientGone releases the key when the client disconnected and the
// handler wrote nothing: there is no outcome worth storing.
var errClientGone = errors.New("idem: client went away before the handler answered")

// netHTTPRequest is a net/http request as the engine reads it
// (httpidem.Request), for Middleware.protects before anything is
// allocated.
type netHTTPRequest struct{ r *http.Request }

// httpExchange is a protected net/http request and its response
// (httpidem.Exchange), with the engine's state in the same allocation:
// the body handed to the handler and the recorder of its response.
//
// Its fields are few on purpose: the response writer is rec.w and the
// middleware ex.m, since every byte of it is allocated per request.
type httpExchange struct {
	netHTTPRequest
	next http.Handler
	body replayBody
	rec  recorder
	ex   exchange
	// room holds, first, a request body that fits (with the spare byte
	// Body reads into), and after it (from used) the recorder's first
	// buffer: a small request and a small response need no allocations
	// of their own. One room shared by both, rather than one each of a
	// fixed size, keeps the exchange within 760 bytes (with the runtime's
	// 8-byte header for objects with pointers over 512 bytes, the size
	// class 768, below 896; allocated per request) and lets either be
	// larger when
	// the other is small. The body is read-only once read, and whatever
	// keeps either part (the handler's reader, a stored payload or
	// response body) keeps the exchange alive with it.
	used int
	room [roomSize]byte
}

// roomSize is the room for a request body and a response body in the
// exchange's allocation (see httpExchange.room): small JSON requests and
// responses (the benchmarks' 100 bytes each) fit.
const roomSize = 416

func (q netHTTPRequest) Context() context.Context    { return q.r.Context() }
func (q netHTTPRequest) Method() string              { return q.r.Method }
func (q netHTTPRequest) Target() string              { return q.r.URL.RequestURI() }
func (q netHTTPRequest) Header(name string) []string { return q.r.Header[name] }

// Body is unused by Middleware.protects; httpExchange reads the body.
func (q netHTTPRequest) Body(int64) ([]byte, error)            { return nil, nil }
func (q netHTTPRequest) Tenant() (string, error)               { return "", nil }
func (q netHTTPRequest) Payload([]byte) ([]byte, error)        { return nil, nil }
func (q netHTTPRequest) Operation() (name string, routed bool) { return "", false }

// Operation names the operation a request invokes: Config.OperationFunc,
// or the request's ServeMux pattern, or the method and the URL path.
func (hx *httpExchange) Operation() (string, bool) {
	r := hx.r
	if hx.ex.m.cfg.OperationFunc != nil {
		return hx.ex.m.cfg.OperationFunc(r), false
	}
	if p := r.Pattern; p != "" {
		if len(p) > len(r.Method) && p[len(r.Method)] == ' ' && p[:len(r.Method)] == r.Method {
			return p, true
		}
		return r.Method + " " + p, true
	}
	return r.Method + " " + r.URL.Path, false
}

func (hx *httpExchange) Tenant() (string, error) {
	if hx.ex.m.cfg.TenantFunc == nil {
		return "", nil
	}
	return hx.ex.m.cfg.TenantFunc(hx.r)
}

func (hx *httpExchange) Payload(body []byte) ([]byte, error) {
	if hx.ex.m.cfg.FingerprintFunc == nil {
		return nil, nil
	}
	return hx.ex.m.cfg.FingerprintFunc(hx.r, body)
}

// Body reads the whole request body, within limit, and puts a replayable
// copy back for the handler.
func (hx *httpExchange) Body(limit int64) ([]byte, error) {
	r := hx.r
	if r.ContentLength > limit {
		return nil, httpidem.ErrBodyTooLarge
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	var body []byte
	var err error
	if r.ContentLength >= 0 {
		// One spare byte of capacity receives the check below.
		if r.ContentLength < roomSize {
			hx.used = int(r.ContentLength) + 1
			body = hx.room[: r.ContentLength : r.ContentLength+1]
		} else {
			body = make([]byte, r.ContentLength, r.ContentLength+1)
		}
		_, err = io.ReadFull(r.Body, body)
		if err == nil {
			// Content-Length is trusted by net/http; a longer body is
			// an error of the server, not ours, but check anyway.
			if n, _ := r.Body.Read(body[len(body):cap(body)]); n > 0 {
				return nil, httpidem.ErrBodyTooLarge
			}
		}
	} else {
		body, err = io.ReadAll(io.LimitReader(r.Body, limit+1))
		if err == nil && int64(len(body)) > limit {
			return nil, httpidem.ErrBodyTooLarge
		}
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, httpidem.ErrBodyTooLarge
		}
		return nil, err
	}
	hx.body.Reset(body)
	r.Body = &hx.body
	return body, nil
}

func (hx *httpExchange) SetHeader(name string, values []string) { hx.rec.w.Header()[name] = values }

// Run runs next with the execution's context, recording its response.
func (hx *httpExchange) Run(ctx context.Context, expiresAt time.Time) (*Response, error) {
	rec := &hx.rec
	*rec = recorder{w: rec.w, limit: hx.ex.m.cfg.MaxResponseBody, header: make(http.Header), buf: hx.room[hx.used:hx.used], expiresAt: expiresAt}
	hx.next.ServeHTTP(rec, hx.r.WithContext(ctx))
	if !rec.wroteHeader && hx.r.Context().Err() != nil {
		return nil, errClientGone
	}
	return rec.response(), nil
}

func (hx *httpExchange) Sent() bool { return hx.rec.streamed }

func (hx *httpExchange) Write(resp *Response, replayed bool) {
	if replayed {
		writeResponse(hx.rec.w, resp, resp.Header)
		return
	}
	// The handler has returned: its own header values can be sent
	// without copying.
	h := hx.rec.w.Header()
	for k, vs := range hx.rec.header {
		if !isIdemField(k) {
			h[k] = vs
		}
	}
	writeResponse(hx.rec.w, resp, nil)
}

func (hx *httpExchange) Problem(p error) { hx.ex.m.cfg.ErrorFunc(hx.rec.w, hx.r, p.(*Problem)) }

func (hx *httpExchange) Pass() { hx.next.ServeHTTP(hx.rec.w, hx.r) }
