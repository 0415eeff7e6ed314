package proxy

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// Go's HTTP client deletes a response's Connection field when it contains
// "close" (net/http's shouldClose), so neither httputil.ReverseProxy nor
// the idempotency middleware can see which other fields the upstream
// declared connection-specific in that response, and would forward, store
// and replay them (RFC 9110 section 7.6.1 forbids it). No hook of
// net/http exposes the raw header. The proxy therefore keeps the last
// bytes read on each plain-HTTP upstream connection (captureConn) and, for
// a response whose Connection field the client removed, finds that
// response's header block in them, checks it is the one the client parsed
// (every parsed field present with the same values), and removes the
// fields its Connection field names. An HTTPS upstream speaks HTTP/2 when
// it can, where Connection does not exist; over HTTPS with HTTP/1.1 the
// bytes are encrypted below the client, and such a field is logged, not
// removed (documented in docs/proxy.md).

// captureSize is how many of the last bytes read each upstream connection
// keeps: the client reads ahead at most its 4 KiB read buffer beyond a
// header, so headers up to about 12 KiB are found. It costs 16 KiB per
// open upstream connection (4 MiB for the 256 idle ones the transport
// keeps) and a copy of every byte read; BenchmarkProxyPaired showed no
// difference beyond its noise on a loaded machine.
const captureSize = 16 << 10

// captureConn records the last captureSize bytes read from a connection.
type captureConn struct {
	net.Conn
	mu   sync.Mutex
	ring []byte // allocated at the first read
	n    int64  // bytes read in all
}

func (c *captureConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		if c.ring == nil {
			c.ring = make([]byte, captureSize)
		}
		b := p[:n]
		if len(b) > captureSize {
			c.n += int64(len(b) - captureSize) // bytes that leave the window at once
			b = b[len(b)-captureSize:]
		}
		for len(b) > 0 {
			at := int(c.n % captureSize)
			k := copy(c.ring[at:], b)
			c.n += int64(k)
			b = b[k:]
		}
		c.mu.Unlock()
	}
	return n, err
}

// recent returns the bytes kept, oldest first.
func (c *captureConn) recent() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n <= captureSize {
		return slices.Clone(c.ring[:c.n])
	}
	at := int(c.n % captureSize)
	return append(slices.Clone(c.ring[at:]), c.ring[:at]...)
}

// captureDialer wraps a dial function so that its connections record
// what they read.
func captureDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &captureConn{Conn: c}, nil
	}
}

// connTrace records, in the exchange, the connection a request was sent
// on.
func connTrace(ctx context.Context, conn *atomic.Pointer[net.Conn]) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { conn.Store(&info.Conn) },
	})
}

// closeDropped reports whether the client removed res's Connection field
// because it said close: an HTTP/1.1 response that closes its connection
// and has no Connection field left. (A body delimited by the connection's
// end also closes it; its header then simply lists nothing.)
func closeDropped(res *http.Response) bool {
	return res.Close && res.ProtoMajor == 1 && res.ProtoMinor >= 1 && res.Header["Connection"] == nil
}

// droppedConnection returns the Connection field values of res as the
// upstream sent them, from the bytes its connection read, and whether its
// header block was found.
func droppedConnection(res *http.Response, c *captureConn) ([]string, bool) {
	raw := c.recent()
	statusLine := []byte(res.Proto + " " + res.Status + "\r\n")
	for end := len(raw); ; {
		i := bytes.LastIndex(raw[:end], statusLine)
		if i < 0 {
			return nil, false
		}
		// A response may follow a body that did not end with a line
		// break, so the status line need not start a line; the parsed
		// fields decide whether this is the header.
		end = i
		block := raw[i+len(statusLine):]
		hdr, err := textproto.NewReader(bufio.NewReader(bytes.NewReader(block))).ReadMIMEHeader()
		if err != nil || !parsedFrom(res.Header, hdr) {
			continue
		}
		return hdr["Connection"], true
	}
}

// parsedFrom reports whether every field of parsed has the same values in
// raw: raw is the header the client parsed parsed from.
func parsedFrom(parsed http.Header, raw textproto.MIMEHeader) bool {
	for k, vs := range parsed {
		if !slices.Equal(vs, raw[k]) {
			return false
		}
	}
	return true
}

// removeConnectionFields deletes from h the fields that Connection values
// conn name (RFC 9110 section 7.6.1), and reports which.
func removeConnectionFields(h http.Header, conn []string) []string {
	var removed []string
	for _, v := range conn {
		for _, tok := range strings.Split(v, ",") {
			name := textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(tok))
			if name == "" || strings.EqualFold(name, "close") {
				continue
			}
			if _, ok := h[name]; ok {
				delete(h, name)
				removed = append(removed, name)
			}
		}
	}
	return removed
}
