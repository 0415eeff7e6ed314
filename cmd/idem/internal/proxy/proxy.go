// Package proxy is the engine of `idem proxy`: a reverse proxy that puts
// the Idempotency-Key contract in front of an HTTP API that cannot be
// changed.
//
// Each route (a net/http ServeMux pattern) gets its own idem.Middleware,
// configured from Settings; the handler behind every middleware is one
// httputil.ReverseProxy to the upstream. The middleware claims the key,
// fingerprints the request, renews the lease while the upstream works,
// stores the upstream's status, header and body, and replays them; the
// proxy adds only what a gateway must: forwarding (X-Forwarded-For, -Host,
// -Proto; hop-by-hop fields removed as RFC 9110 requires), a timeout, and
// problem+json answers when the upstream fails. Protected requests ask the
// upstream for an uncompressed answer, which any retry can read (see
// encoding.go). The server in front of a Proxy should refuse requests
// whose length can be read two ways (GuardFraming): net/http settles them
// by itself, and a front end that reads them the other way would smuggle
// a second request through the proxy.
//
// Outcomes: the upstream's 2xx, 3xx and 4xx responses are stored and
// replayed byte for byte; its 5xx responses release the key, and so do the
// proxy's own answers for an unreachable upstream (502
// proxy.upstream_unreachable) or a timeout (504 proxy.upstream_timeout). A
// store that cannot be reached answers 503 idempotency.store_unavailable
// and the upstream is not called.
//
// The proxy cannot join the upstream's database transaction. If the proxy
// dies while the upstream works, the record stays in flight until its
// lease passes and a retry then runs the request again: at-least-once for
// that request. Every other path is exactly-once per key within the TTL.
package proxy

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/metrics"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
)

// Problem codes of the proxy's own error responses. Both release the key.
const (
	// CodeUpstreamUnreachable (502): the proxy could not connect to the
	// upstream, so the request was not delivered.
	CodeUpstreamUnreachable = "proxy.upstream_unreachable"
	// CodeUpstreamFailed (502): the connection to the upstream failed
	// after the request was sent, or the upstream's answer was not valid
	// HTTP. The upstream may have acted on the request.
	CodeUpstreamFailed = "proxy.upstream_failed"
	// CodeUpstreamTimeout (504): the upstream did not answer within the
	// route's upstream timeout. It may still act on the request.
	CodeUpstreamTimeout = "proxy.upstream_timeout"
	// CodeLoopDetected (508): the request already passed through this
	// proxy (its Via field names it): the upstream leads back to the
	// proxy. It is not forwarded again.
	CodeLoopDetected = "proxy.loop_detected"
)

// problemTypeBase prefixes a proxy problem code to form its type URI.
const problemTypeBase = "https://github.com/idemhq/idem/blob/main/docs/proxy.md#"

// Route is a route with its own settings.
type Route struct {
	// Pattern is a net/http ServeMux pattern ("POST /payments",
	// "/orders/{id}/refund"). It also names the operation: one key used on
	// two requests that match the same pattern but differ (another
	// path, another body) is answered 422.
	Pattern string
	// Settings apply to requests that match Pattern.
	Settings Settings
}

// Config configures a Proxy. Upstream and Store are required.
type Config struct {
	// Upstream is the base URL requests are forwarded to (http or https);
	// its path, if any, prefixes the request's path.
	Upstream *url.URL

	// Store keeps the idempotency records. Several proxies sharing one
	// store (PostgreSQL, Redis, one SQLite file on one machine) behave as
	// one.
	Store idemstore.Store

	// Defaults are the settings of requests that match no route.
	// Defaults to DefaultSettings() when zero (Lease unset).
	Defaults Settings

	// Routes have their own settings. Requests that match no route use
	// Defaults; their operation is the method and path.
	Routes []Route

	// Transport sends requests to the upstream. Defaults to a clone of
	// http.DefaultTransport that keeps up to 256 idle connections to the
	// upstream and never changes the client's Accept-Encoding.
	Transport http.RoundTripper

	// Metrics, if set, counts outcomes and times requests by route.
	// Defaults to none.
	Metrics *metrics.Metrics

	// ProblemBaseURL is idem.Config.ProblemBaseURL for every route: the
	// base of the type URL of the proxy's own problems. Defaults to the
	// core's.
	ProblemBaseURL string

	// Observer, if set, is told about every outcome too (idem serve and
	// idem proxy pass the OpenTelemetry observer here). Defaults to none.
	Observer idem.Observer

	// Logger receives the upstream failures and the core's warnings.
	// Defaults to slog.Default().
	Logger *slog.Logger

	// StoreTimeout bounds each store call of every route
	// (idem.Config.StoreTimeout). Defaults to the core's default.
	StoreTimeout time.Duration

	// Encryption, if set, encrypts every stored response (see
	// idem.Config.Encryption). Defaults to none.
	Encryption *idemcrypt.Encryption
}

// Proxy is an http.Handler that forwards requests to the upstream through
// the idempotency middleware of their route.
type Proxy struct {
	upstream *url.URL
	rp       *httputil.ReverseProxy
	logger   *slog.Logger
	// unseenConnection logs once that a connection's Connection field
	// cannot be read (see restoreConnection).
	unseenConnection sync.Once
	// storedCoding logs once that a content-coded response to a protected
	// request is stored as it came (see decodeContent).
	storedCoding sync.Once
	// via is this proxy's pseudonym in the Via field of the requests it
	// forwards ("idem-" and random hex, new for every Proxy), by which it
	// recognises a request that comes back to it.
	via string

	mux      *http.ServeMux
	routes   map[string]*route
	fallback *route
}

// route is a configured route: its settings and its handler chain.
type route struct {
	pattern  string
	settings Settings
	handler  http.Handler
}

// errUpstreamTimeout is the cancellation cause of an exchange whose
// upstream timeout passed.
var errUpstreamTimeout = errors.New("proxy: upstream timeout")

// New returns a Proxy. It starts no goroutines and opens no connections.
func New(cfg *Config) (*Proxy, error) {
	if cfg == nil || cfg.Upstream == nil || cfg.Store == nil {
		return nil, errors.New("proxy: Upstream and Store are required")
	}
	u := cfg.Upstream
	if err := CheckUpstream(u); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	transport := cfg.Transport
	if transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns = 512
		t.MaxIdleConnsPerHost = 256
		// The proxy must not ask for compression on the client's behalf
		// and decode it: the client's own Accept-Encoding goes through,
		// and the stored bytes are what the upstream sent.
		t.DisableCompression = true
		if u.Scheme == "http" {
			// See connfields.go: the fields a "Connection: close" response
			// names are found in the bytes read.
			t.DialContext = captureDialer(t.DialContext)
		}
		transport = t
	}
	p := &Proxy{upstream: u, logger: logger, routes: map[string]*route{}, via: "idem-" + strings.ToLower(rand.Text()[:12])}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        p.rewrite,
		Transport:      transport,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		ErrorLog:       slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		BufferPool:     bufferPool{},
	}

	defaults := cfg.Defaults
	if defaults.Lease == 0 {
		defaults = DefaultSettings()
	}
	var err error
	if p.fallback, err = p.newRoute("", defaults, cfg); err != nil {
		return nil, fmt.Errorf("proxy: defaults: %w", err)
	}
	if len(cfg.Routes) > 0 {
		p.mux = http.NewServeMux()
	}
	for _, r := range cfg.Routes {
		if err := register(p.mux, r.Pattern); err != nil {
			return nil, fmt.Errorf("proxy: route %q: %w", r.Pattern, err)
		}
		rt, err := p.newRoute(r.Pattern, r.Settings, cfg)
		if err != nil {
			return nil, fmt.Errorf("proxy: route %q: %w", r.Pattern, err)
		}
		p.routes[r.Pattern] = rt
	}
	return p, nil
}

// CheckUpstream accepts an http:// or https:// URL with a host (and a
// port, if it has a colon).
func CheckUpstream(u *url.URL) error {
	if (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || strings.HasSuffix(u.Host, ":") {
		return fmt.Errorf("upstream %q must be an http:// or https:// URL with a host", u.Redacted())
	}
	return nil
}

// register adds pattern to mux, turning ServeMux's panics on invalid or
// conflicting patterns into errors. The handler is never called: the mux
// only matches (see ServeHTTP).
func register(mux *http.ServeMux, pattern string) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("%v", v)
		}
	}()
	mux.Handle(pattern, http.NotFoundHandler())
	return nil
}

// newRoute builds a route's handler chain: metrics, the idempotency
// middleware, and the forwarding handler.
func (p *Proxy) newRoute(pattern string, s Settings, cfg *Config) (*route, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	var observer idem.Observer
	switch {
	case cfg.Metrics != nil && cfg.Observer != nil:
		observer = bothObservers{cfg.Metrics, cfg.Observer}
	case cfg.Metrics != nil:
		observer = cfg.Metrics
	case cfg.Observer != nil:
		observer = cfg.Observer
	}
	mw, err := idem.NewMiddleware(cfg.Store, &idem.Config{
		Lease:           s.Lease,
		TTL:             s.TTL,
		Wait:            s.Wait,
		OutcomeFunc:     s.Outcome.Outcome,
		Observer:        observer,
		Logger:          p.logger,
		Requirement:     s.Key,
		RequiredMethods: s.Methods,
		TenantFunc:      scopeFunc(s.ScopeHeader),
		MaxRequestBody:  s.MaxRequestBody,
		MaxResponseBody: int(s.MaxResponseBody),
		StoreTimeout:    cfg.StoreTimeout,
		Encryption:      cfg.Encryption,
		// A cookie set for the first client is never handed to whoever
		// retries; Set-Cookie2 is its obsolete twin (RFC 2965).
		ReplayDenyHeaders: []string{"Set-Cookie", "Set-Cookie2"},

		ProblemBaseURL:     cfg.ProblemBaseURL,
		FingerprintExclude: s.FingerprintExclude,
		FingerprintInclude: s.FingerprintInclude,
	})
	if err != nil {
		return nil, err
	}
	rt := &route{pattern: pattern, settings: s}
	var h http.Handler = &forwarder{p: p, timeout: s.UpstreamTimeout}
	if cfg.Metrics != nil {
		h = cfg.Metrics.InFlight(h)
	}
	h = mw.Handle(h)
	if cfg.Metrics != nil {
		label := pattern
		if label == "" {
			label = "default"
		}
		h = cfg.Metrics.Instrument(label, h)
	}
	rt.handler = h
	return rt, nil
}

// ServeHTTP forwards r through the middleware of its route.
//
// Routes are matched by the ServeMux, but the mux never answers: a path
// that the mux would redirect (not in canonical form, or a subtree without
// its trailing slash) is matched as the path it would redirect to and
// forwarded unchanged, and a request that matches no route (or only with
// another method) uses the defaults. The upstream, not the proxy, decides
// what such requests mean.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.looped(r) {
		p.logger.LogAttrs(r.Context(), slog.LevelError, "request loop: the upstream leads back to this proxy",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("upstream", p.upstream.Redacted()))
		prob := &idem.Problem{Status: http.StatusLoopDetected, Code: CodeLoopDetected, Type: problemTypeBase + CodeLoopDetected,
			Title:  "Request loop",
			Detail: "The request came back to the proxy that forwarded it: the proxy's upstream leads back to the proxy. Fix the upstream address."}
		idem.WriteProblem(w, prob)
		return
	}
	rt := p.fallback
	// The middleware names the operation after r.Pattern, or after the
	// method and path without one.
	r.Pattern = ""
	if p.mux != nil {
		if _, pat := p.mux.Handler(r); pat != "" {
			if m, ok := p.routes[pat]; ok {
				rt = m
				r.Pattern = pat
			}
		}
	}
	rt.handler.ServeHTTP(w, r)
}

// looped reports whether r's Via field names this proxy.
func (p *Proxy) looped(r *http.Request) bool {
	for _, v := range r.Header["Via"] {
		for _, hop := range strings.Split(v, ",") {
			// received-protocol received-by [comment]
			f := strings.Fields(hop)
			if len(f) >= 2 && f[1] == p.via {
				return true
			}
		}
	}
	return false
}

// Route returns the pattern of the route a request matches, or "" for the
// defaults.
func (p *Proxy) Route(r *http.Request) string {
	if p.mux == nil {
		return ""
	}
	if _, pat := p.mux.Handler(r); p.routes[pat] != nil {
		return pat
	}
	return ""
}

// MaxHandlerTime returns the longest a request may wait before its
// response starts (a route's wait plus its upstream timeout), so that the
// server's write timeout can leave room for it.
func (p *Proxy) MaxHandlerTime() time.Duration {
	d := p.fallback.settings.Wait + p.fallback.settings.UpstreamTimeout
	for _, rt := range p.routes {
		d = max(d, rt.settings.Wait+rt.settings.UpstreamTimeout)
	}
	return d
}

// forwarder is the handler behind a route's middleware: it sends the
// request to the upstream under the route's timeout.
type forwarder struct {
	p       *Proxy
	timeout time.Duration
}

// exchange is the state of one forwarded request, reachable from the
// outgoing request's context.
type exchange struct {
	context.Context // cancelled when the exchange ends or times out
	w               http.ResponseWriter
	protected       bool
	timer           *time.Timer
	conn            atomic.Pointer[net.Conn] // the upstream connection used
}

type exchangeKey struct{}

// Value makes the exchange reachable from the outgoing request, whose
// context derives from it.
func (x *exchange) Value(key any) any {
	if key == (exchangeKey{}) {
		return x
	}
	return x.Context.Value(key)
}

func (f *forwarder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	parent := r.Context()
	_, protected := idem.InfoFromContext(parent)
	if protected {
		// A protected exchange outlives its client: once the request is
		// claimed and forwarded, the upstream may act on it, so its
		// answer is awaited and stored even if the client has gone, and
		// the client's retry replays it instead of running it again. It
		// still ends on the timeout, and when the lease is lost (the
		// core cancels the request's context with ErrLeaseLost).
		parent = context.WithoutCancel(parent)
	}
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	if protected {
		stop := context.AfterFunc(r.Context(), func() {
			if cause := context.Cause(r.Context()); errors.Is(cause, idemstore.ErrLeaseLost) {
				cancel(cause)
			}
		})
		defer stop()
	}
	x := &exchange{Context: ctx, w: w, protected: protected}
	x.timer = time.AfterFunc(f.timeout, func() { cancel(errUpstreamTimeout) })
	defer x.timer.Stop()
	if protected {
		// The middleware buffers the response to store it; a flush would
		// send it unstored (see holdFlushes).
		w = &holdFlushes{ResponseWriter: w}
	}
	f.p.rp.ServeHTTP(w, r.WithContext(connTrace(x, &x.conn)))
}

// rewrite directs a request to the upstream, sets X-Forwarded-For,
// X-Forwarded-Host and X-Forwarded-Proto, and adds the proxy to Via. ReverseProxy has already removed
// the hop-by-hop fields and the client's own X-Forwarded-* and Forwarded
// fields, which a client could forge. The Idempotency-Key field goes
// through unchanged, so that the upstream can pass it on to its own
// providers.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(p.upstream)
	pr.SetXForwarded()
	// Via (RFC 9110 section 7.6.3) names this proxy, so that a request
	// that comes back to it is recognised (see looped).
	proto := fmt.Sprintf("%d.%d", pr.In.ProtoMajor, pr.In.ProtoMinor)
	if pr.In.ProtoMajor >= 2 {
		proto = strconv.Itoa(pr.In.ProtoMajor)
	}
	pr.Out.Header["Via"] = append(pr.Out.Header["Via"], proto+" "+p.via)
	if x, _ := pr.In.Context().Value(exchangeKey{}).(*exchange); x != nil && x.protected {
		// The stored response is replayed to every retry, whatever the
		// retry accepts: ask for it uncompressed (an absent field would
		// allow any coding), so that every retry can read it. See
		// decodeContent for an upstream that compresses anyway.
		pr.Out.Header.Set("Accept-Encoding", "identity")
	}
	// A protected request's body was read in full by the middleware: send
	// it with a Content-Length even if the client sent it chunked, since
	// some upstreams refuse chunked requests. An empty one goes as a
	// request with Content-Length: 0 would: net/http's client would
	// otherwise send a body of unknown length, chunked.
	if pr.Out.ContentLength < 0 {
		if b, ok := pr.In.Body.(interface{ Len() int }); ok {
			pr.Out.ContentLength = int64(b.Len())
			pr.Out.TransferEncoding = nil
			if b.Len() == 0 {
				pr.Out.Body = http.NoBody
			}
		}
	}
}

// modifyResponse runs when the upstream's response header has arrived. A
// pass-through response then streams for as long as it takes: its timeout
// stops, and so does the server's write deadline for a streamed body
// (server-sent events, unknown length).
func (p *Proxy) modifyResponse(res *http.Response) error {
	x, _ := res.Request.Context().Value(exchangeKey{}).(*exchange)
	if x != nil && closeDropped(res) {
		p.restoreConnection(res, x)
	}
	if x != nil && x.protected {
		return p.decodeContent(res)
	}
	if x == nil {
		return nil
	}
	x.timer.Stop()
	if res.ContentLength < 0 || isEventStream(res.Header.Get("Content-Type")) {
		_ = http.NewResponseController(x.w).SetWriteDeadline(time.Time{})
	}
	return nil
}

// restoreConnection removes from res the fields that its Connection
// field, which the client removed because it said close, named (see
// connfields.go). ReverseProxy has removed the rest of the hop-by-hop
// fields already.
func (p *Proxy) restoreConnection(res *http.Response, x *exchange) {
	var cc *captureConn
	if c := x.conn.Load(); c != nil {
		cc, _ = (*c).(*captureConn)
	}
	if cc == nil {
		p.unseenConnection.Do(func() {
			p.logger.Warn("an upstream response said Connection: close over a connection whose bytes the proxy cannot read (HTTPS with HTTP/1.1): fields it names as connection-specific, if any, are forwarded and stored",
				"upstream", p.upstream.Redacted())
		})
		return
	}
	conn, found := droppedConnection(res, cc)
	if !found {
		p.logger.Warn("an upstream response said Connection: close and its header was not found in the bytes read (larger than the proxy keeps): fields it names as connection-specific, if any, are forwarded and stored",
			"method", res.Request.Method, "path", res.Request.URL.Path)
		return
	}
	if removed := removeConnectionFields(res.Header, conn); len(removed) > 0 {
		p.logger.Debug("removed connection-specific fields of an upstream response", "fields", removed)
	}
}

// errorHandler answers a failed exchange with problem+json: 504 after the
// timeout, 502 otherwise. Both statuses release the key (see
// OutcomePolicy). Nothing is written when the client has gone away or the
// lease was lost: nobody would read it, and the middleware releases the
// key (or reports the lost lease) by itself.
func (p *Proxy) errorHandler(w http.ResponseWriter, r *http.Request, err error) {
	ctx := r.Context()
	cause := context.Cause(ctx)
	var prob *idem.Problem
	reason, broken := bodyBroken(ctx)
	switch {
	case broken:
		// The client's chunked body broke off while it was forwarded:
		// the client's fault, not the upstream's.
		prob = &idem.Problem{Status: http.StatusBadRequest, Code: CodeBadFraming,
			Title:  "The request's framing is ambiguous or malformed",
			Detail: "The request's chunked body is malformed (" + reason + "); the proxy stopped forwarding it where it broke and closes the connection. The upstream received the request with its body cut short."}
		w.Header().Set("Connection", "close")
	case errors.Is(cause, errUpstreamTimeout):
		prob = &idem.Problem{Status: http.StatusGatewayTimeout, Code: CodeUpstreamTimeout,
			Title:  "The upstream did not answer in time",
			Detail: "The upstream service did not answer within the proxy's timeout; it may still complete the request. The Idempotency-Key was released: retry with the same key."}
	case ctx.Err() != nil:
		p.logger.LogAttrs(ctx, slog.LevelDebug, "upstream request abandoned", slog.String("method", r.Method),
			slog.String("path", r.URL.Path), slog.Any("cause", cause))
		return
	case isDialError(err):
		prob = &idem.Problem{Status: http.StatusBadGateway, Code: CodeUpstreamUnreachable,
			Title:  "The upstream is unreachable",
			Detail: "The proxy could not connect to the upstream service; the request was not delivered. The Idempotency-Key was released: retry with the same key."}
	default:
		prob = &idem.Problem{Status: http.StatusBadGateway, Code: CodeUpstreamFailed,
			Title:  "The upstream failed",
			Detail: "The connection to the upstream service failed before it answered; it may have acted on the request. The Idempotency-Key was released: retry with the same key."}
	}
	prob.Type = problemTypeBase + prob.Code
	if !broken {
		prob.RetryAfter = 1
	}
	p.logger.LogAttrs(ctx, slog.LevelWarn, "upstream request failed", slog.String("method", r.Method),
		slog.String("path", r.URL.Path), slog.Int("status", prob.Status), slog.String("code", prob.Code), slog.Any("error", err))
	idem.WriteProblem(w, prob)
}

// isDialError reports whether err is a failure to connect, which means the
// upstream never saw the request.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func isEventStream(contentType string) bool {
	mt, _, _ := mime.ParseMediaType(contentType)
	return mt == "text/event-stream"
}

// holdFlushes wraps the middleware's response recorder for a protected
// request. ReverseProxy flushes after every write when the upstream's
// response has no Content-Length; a flush makes the recorder send the
// response at once, unstored, and a retry would then get 409
// idempotency.response_unavailable instead of a replay. holdFlushes drops
// those flushes so the response is stored, except for server-sent events,
// which are a stream by nature and pass through as one.
type holdFlushes struct {
	http.ResponseWriter
}

// FlushError implements the interface http.ResponseController prefers.
func (h *holdFlushes) FlushError() error {
	if isEventStream(h.Header().Get("Content-Type")) {
		return http.NewResponseController(h.ResponseWriter).Flush()
	}
	return nil
}

// Unwrap lets http.ResponseController reach the recorder for everything
// else (hijacking, deadlines).
func (h *holdFlushes) Unwrap() http.ResponseWriter { return h.ResponseWriter }

// bufferPool reuses ReverseProxy's copy buffers; without one it allocates
// 32 KiB per request.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

func (bufferPool) Get() []byte  { return *copyBuffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(&b) }

// bothObservers tells two observers about each event, and hands phases to
// the first that traces them (idem.PhaseObserver).
type bothObservers [2]idem.Observer

func (b bothObservers) Observe(ctx context.Context, e idem.Event) {
	b[0].Observe(ctx, e)
	b[1].Observe(ctx, e)
}

// StartPhase implements idem.PhaseObserver.
func (b bothObservers) StartPhase(ctx context.Context, ph idem.Phase, info idem.PhaseInfo) (context.Context, func(error)) {
	for _, o := range b {
		if po, ok := o.(idem.PhaseObserver); ok {
			return po.StartPhase(ctx, ph, info)
		}
	}
	return ctx, func(error) {}
}
