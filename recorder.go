package idem

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"time"
)

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
	header    http.Header
	status    int
	buf       []byte
	limit     int
	expiresAt time.Time

	wroteHeader bool
	streamed    bool

	// resp is what response returns, held in the recorder's allocation
	// (the middleware's per-request state): one allocation less per
	// execution.
	resp Response
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
// handler's header fields, or an unreplayable marker.
func (rw *recorder) response() *Response {
	status := rw.status
	if !rw.wroteHeader {
		status = http.StatusOK
	}
	if rw.streamed {
		rw.resp = Response{StatusCode: status, Unreplayable: true}
		return &rw.resp
	}
	// The handler has returned, so its header map is ours to keep (the
	// engine leaves out the fields never stored, see storedHeader).
	body := rw.buf
	if len(body) == 0 {
		body = nil // as before the first buffer was the exchange's
	}
	rw.resp = Response{StatusCode: status, Header: rw.header, Body: body}
	return &rw.resp
}

// replayBody gives the handler the body idem read, as one allocation. Its
// Len method (from bytes.Reader) is part of its contract: a reverse proxy
// behind the middleware uses it to send a Content-Length upstream for a
// request the client sent chunked.
type replayBody struct{ bytes.Reader }

func (*replayBody) Close() error { return nil }
