package check

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// sendRaw writes q as a minimal HTTP/1.1 request on a connection of its
// own, so that the Idempotency-Key values reach the server byte for byte:
// net/http refuses control characters, and the bytes of other malformed
// values should not depend on what a client library lets through. Over
// https it uses the client transport's TLS configuration when it can find
// one.
func (r *runner) sendRaw(ctx context.Context, q request) (int, http.Header, []byte, error) {
	u := r.target
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	addr := net.JoinHostPort(u.Hostname(), port)
	var conn net.Conn
	var err error
	if u.Scheme == "https" {
		d := tls.Dialer{Config: r.tlsConfig()}
		conn, err = d.DialContext(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return 0, nil, nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: idem-check\r\nConnection: close\r\n", r.o.Method, u.RequestURI(), u.Host)
	for k, vs := range r.header(q) {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, strings.NewReplacer("\r", "", "\n", "").Replace(v))
		}
	}
	if len(q.body) > 0 || r.o.Method == http.MethodPost || r.o.Method == http.MethodPut || r.o.Method == http.MethodPatch {
		fmt.Fprintf(&b, "Content-Length: %s\r\n", strconv.Itoa(len(q.body)))
	}
	for _, k := range q.keys {
		fmt.Fprintf(&b, "Idempotency-Key: %s\r\n", k)
	}
	b.WriteString("\r\n")
	b.Write(q.body)
	if _, err := conn.Write(b.Bytes()); err != nil {
		return 0, nil, nil, ctxErr(ctx, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: r.o.Method})
	if err != nil {
		return 0, nil, nil, ctxErr(ctx, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return 0, nil, nil, ctxErr(ctx, fmt.Errorf("reading the response body: %w", err))
	}
	return resp.StatusCode, resp.Header, body, nil
}

// ctxErr prefers the context's error to the closed-connection error its end
// causes.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}

// tlsConfig returns the TLS settings for hand-written requests: the client
// transport's, when it is an *http.Transport that has some.
func (r *runner) tlsConfig() *tls.Config {
	var c *tls.Config
	if t, ok := r.o.Client.Transport.(*http.Transport); ok && t.TLSClientConfig != nil {
		c = t.TLSClientConfig.Clone()
	} else {
		c = &tls.Config{}
	}
	if c.ServerName == "" {
		c.ServerName = r.target.Hostname()
	}
	c.NextProtos = []string{"http/1.1"} // the request is written as HTTP/1.1
	return c
}
