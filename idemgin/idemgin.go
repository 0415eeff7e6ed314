// Package idemgin adapts idem's middleware to gin
// (github.com/gin-gonic/gin): the same contract as idem.Middleware (keys,
// fingerprints, replays, 409/422 problems, fail closed), for routes of a gin
// engine.
//
//	mw, err := idem.NewMiddleware(store, nil)
//	...
//	r := gin.New()
//	r.POST("/orders", idemgin.Middleware(mw), createOrder)
//
// The handlers after the middleware run at most once per key. Their
// response, written through the gin.Context as usual, is recorded, stored
// and sent; a retry replays it without running them. The request context
// (c.Request.Context()) carries the execution, so the transactional pattern
// works unchanged: on a transactional store (sqlitestore, pgstore) a handler
// asks for its transaction with sqlitestore.Tx(c.Request.Context()) or
// pgstore.Tx, and its writes commit together with the stored response.
//
// The operation that names a record defaults to the method and gin's route
// template (c.FullPath(), such as "POST /orders/:id"), so that every order
// of one route shares the route's rules and the same key on two routes
// names two records; idem.Config.OperationFunc overrides it.
package idemgin

import (
	"bufio"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/idemhq/idem"
)

// Middleware returns a gin handler that runs the rest of the chain under m.
// When m answers without running the chain (a replay, 400, 409, 422, 503),
// the chain is aborted.
func Middleware(m *idem.Middleware) gin.HandlerFunc {
	return func(c *gin.Context) {
		ran := false
		outer := c.Writer
		h := m.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			c.Request = r
			// The chain writes into idem's recorder, through a
			// gin.ResponseWriter of its own.
			rw := &responseWriter{ResponseWriter: w, status: http.StatusOK, size: -1}
			c.Writer = rw
			defer func() { c.Writer = outer }()
			c.Next()
			// As gin does after the chain: a status set without a body
			// is sent now, so that idem records it.
			rw.WriteHeaderNow()
		}))
		h.ServeHTTP(outer, withPattern(c))
		if !ran {
			c.Abort()
		}
	}
}

// withPattern returns the request with Pattern set to gin's route template,
// which idem's default OperationFunc reads (as it does ServeMux patterns).
func withPattern(c *gin.Context) *http.Request {
	r := c.Request
	if p := c.FullPath(); p != "" && r.Pattern == "" {
		r = r.WithContext(r.Context())
		r.Pattern = r.Method + " " + p
	}
	return r
}

// responseWriter is the gin.ResponseWriter the chain writes to while idem
// records it. It follows gin's own: WriteHeader only remembers the status
// until the first write (or WriteHeaderNow), so that a handler may change
// it, and the header is sent once.
type responseWriter struct {
	http.ResponseWriter
	status int
	size   int // -1 until the header is sent
}

var _ gin.ResponseWriter = (*responseWriter)(nil)

func (w *responseWriter) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status = code
	}
}

func (w *responseWriter) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.ResponseWriter.WriteHeader(w.status)
	}
}

func (w *responseWriter) Write(p []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.ResponseWriter.Write(p)
	w.size += n
	return n, err
}

func (w *responseWriter) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

func (w *responseWriter) Status() int { return w.status }

func (w *responseWriter) Size() int { return w.size }

func (w *responseWriter) Written() bool { return w.size != -1 }

// Flush sends what was written so far; idem then streams the response and
// stores it as unreplayable (see idem.Response.Unreplayable).
func (w *responseWriter) Flush() {
	w.WriteHeaderNow()
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack hands the connection over, as idem's recorder allows.
func (w *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.size < 0 {
		w.size = 0
	}
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// CloseNotify is required by gin.ResponseWriter; the request context's Done
// channel is what handlers should use.
func (w *responseWriter) CloseNotify() <-chan bool {
	//lint:ignore SA1019 gin.ResponseWriter requires CloseNotify.
	if cn, ok := w.ResponseWriter.(http.CloseNotifier); ok {
		return cn.CloseNotify()
	}
	return make(chan bool)
}

// Pusher returns nil: HTTP/2 server push is not recorded.
func (w *responseWriter) Pusher() http.Pusher { return nil }

// Unwrap lets http.ResponseController reach idem's recorder.
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
