package proxy

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"

	"github.com/idemhq/idem"
)

// Problem codes of the requests the framing guard refuses (see
// GuardFraming). Nothing of such a request is forwarded, and the
// connection is closed after the answer.
const (
	// CodeBadFraming (400): the request's length could be read two ways,
	// or its header is malformed: Content-Length with Transfer-Encoding,
	// two Content-Length fields, a Transfer-Encoding other than exactly
	// "chunked" (or any on HTTP/1.0), a folded field line.
	CodeBadFraming = "proxy.bad_framing"
	// CodeHeaderTooLarge (431): the request header is larger than the
	// server's limit.
	CodeHeaderTooLarge = "proxy.header_too_large"
)

// GuardFraming makes srv refuse requests whose framing is ambiguous, the
// means of request smuggling (RFC 9112 section 6.3), before net/http
// reads them its own way (see framing.go). It returns the listener srv
// must serve: each connection it accepts checks every request header on
// the bytes. A refused request is answered with a problem (CodeBadFraming
// or CodeHeaderTooLarge) and Connection: close, and nothing the client
// sent after its header reaches the server: no second request can be
// read from it.
//
// GuardFraming wraps srv.Handler, so that the refusal is answered before
// any other handler sees the request, and chains srv.ConnContext and
// srv.ConnState (a hijacked connection is no longer HTTP and is no longer
// checked). Call it before serving, and serve nothing but the returned
// listener with srv.
func GuardFraming(srv *http.Server, ln net.Listener, logger *slog.Logger) net.Listener {
	g := &framingGuard{logger: logger, maxHeader: srv.MaxHeaderBytes}
	if g.maxHeader <= 0 {
		g.maxHeader = http.DefaultMaxHeaderBytes
	}
	next := srv.Handler
	if next == nil {
		next = http.DefaultServeMux
	}
	srv.Handler = g.handler(next)
	connContext := srv.ConnContext
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if connContext != nil {
			ctx = connContext(ctx, c)
		}
		if gc, ok := c.(*guardConn); ok {
			ctx = context.WithValue(ctx, guardConnKey{}, gc)
		}
		return ctx
	}
	connState := srv.ConnState
	srv.ConnState = func(c net.Conn, s http.ConnState) {
		if gc, ok := c.(*guardConn); ok && s == http.StateHijacked {
			// net/http has stopped reading (it aborted its pending read
			// first); from now on the bytes belong to whoever hijacked.
			gc.hijacked.Store(true)
		}
		if connState != nil {
			connState(c, s)
		}
	}
	return &guardListener{Listener: ln, g: g}
}

type framingGuard struct {
	logger    *slog.Logger
	maxHeader int
}

type guardConnKey struct{}

// guardListener wraps each accepted connection in a guardConn.
type guardListener struct {
	net.Listener
	g *framingGuard
}

func (l *guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &guardConn{Conn: c, f: newFramer(l.g.maxHeader)}, nil
}

// guardConn is a server connection whose reads pass through a framer.
// net/http reads a connection from one goroutine at a time (its
// background read and the request's reads alternate under its own lock),
// so the framer needs no lock of its own.
type guardConn struct {
	net.Conn
	f *framer
	// readErr is an error the connection returned along with bytes,
	// returned by the next Read once those bytes are read.
	readErr error
	// hijacked is set when net/http hands the connection over to a
	// handler (a protocol upgrade): its bytes then pass unchecked.
	hijacked atomic.Bool
	// refused is the framer's refusal, for the handler that answers the
	// stand-in request.
	refused atomic.Pointer[refusal]
	// broken is the reason a chunked body's framing was invalid, for the
	// answer to its request (see bodyBroken).
	broken atomic.Pointer[string]
}

func (c *guardConn) Read(p []byte) (int, error) {
	f := c.f
	for {
		if out := f.pending(); len(out) > 0 {
			n := copy(p, out)
			f.consumed(n)
			return n, nil
		}
		if c.readErr != nil {
			err := c.readErr
			c.readErr = nil
			return 0, err
		}
		if c.hijacked.Load() {
			if len(f.unit) > 0 && f.state < stRefused {
				// An incomplete unit the framer held goes to the new
				// owner as it came.
				f.out, f.unit = append(f.out, f.unit...), nil
				continue
			}
			return c.Conn.Read(p)
		}
		if len(p) == 0 {
			return 0, nil
		}
		if f.state == stRefused || f.state == stBroken {
			// Read and drop whatever the client still sends: nothing
			// after a refused header or a broken body is a request. The
			// read still ends with the connection's deadline or close.
			if _, err := c.Conn.Read(p); err != nil {
				return 0, err
			}
			continue
		}
		n, err := c.Conn.Read(p)
		k := f.feed(p[:n])
		if f.refusal != nil && c.refused.Load() == nil {
			c.refused.Store(f.refusal)
		}
		if f.broken != "" && c.broken.Load() == nil {
			c.broken.Store(&f.broken)
		}
		if err != nil {
			if k == 0 && len(f.pending()) == 0 {
				return 0, err
			}
			c.readErr = err
		}
		if k > 0 {
			return k, nil
		}
		// Nothing to deliver yet (a header still incomplete) or checked
		// bytes in pending: read on, or return them.
	}
}

// CloseWrite lets net/http half-close the connection after its last
// answer, as it does with a TCP connection (see its closeWriteAndWait).
func (c *guardConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// handler answers the stand-in request of a refused header; every other
// request goes to next.
func (g *framingGuard) handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if vs := r.Header[refusalHeader]; len(vs) == 1 {
			if c, _ := r.Context().Value(guardConnKey{}).(*guardConn); c != nil {
				if ref := c.refused.Load(); ref != nil && subtle.ConstantTimeCompare([]byte(vs[0]), []byte(ref.token)) == 1 {
					g.refuse(w, r, ref)
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// refuse answers a refused request and closes its connection.
func (g *framingGuard) refuse(w http.ResponseWriter, r *http.Request, ref *refusal) {
	g.logger.LogAttrs(r.Context(), slog.LevelWarn, "refused a request whose framing is ambiguous or malformed; closing the connection",
		slog.String("remote", r.RemoteAddr), slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.Int("status", ref.status), slog.String("reason", ref.reason))
	p := &idem.Problem{Status: ref.status, Code: CodeBadFraming,
		Title: "The request's framing is ambiguous or malformed",
		Detail: "The proxy refused the request and closes the connection: " + ref.reason + ". " +
			"A request whose length can be read two ways could carry a second request past a front end (request smuggling, RFC 9112 section 6.3). " +
			"Send the body with one Content-Length, or with Transfer-Encoding: chunked alone on HTTP/1.1. Nothing was forwarded."}
	if ref.status == http.StatusRequestHeaderFieldsTooLarge {
		p.Code, p.Title = CodeHeaderTooLarge, "The request header is too large"
		p.Detail = "The proxy refused the request and closes the connection: " + ref.reason + ". Nothing was forwarded."
	}
	p.Type = problemTypeBase + p.Code
	w.Header().Set("Connection", "close")
	idem.WriteProblem(w, p)
}

// bodyBroken returns why the chunked body of the request whose context is
// ctx broke off, if it did (see framer.breakOff).
func bodyBroken(ctx context.Context) (string, bool) {
	if c, _ := ctx.Value(guardConnKey{}).(*guardConn); c != nil {
		if reason := c.broken.Load(); reason != nil {
			return *reason, true
		}
	}
	return "", false
}

// newRefusalToken returns a token no client can guess.
func newRefusalToken() string { return rand.Text() }
