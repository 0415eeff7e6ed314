package proxy

// Request smuggling, on raw sockets in both directions: the client writes
// bytes a smuggler would send to the proxy's listener, and the upstream
// is a raw TCP listener that keeps every byte the proxy sends it.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
)

// recordingUpstream is an upstream on a raw TCP listener. It keeps every
// byte the proxy sends it, reads requests from them with net/http's
// parser, and answers each 201 with a JSON body naming its path.
type recordingUpstream struct {
	url string

	mu    sync.Mutex
	raw   bytes.Buffer // every byte received, on any connection
	paths []string     // the path of every request read
}

func newRecordingUpstream(t *testing.T) *recordingUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &recordingUpstream{url: "http://" + ln.Addr().String()}
	var wg sync.WaitGroup
	var cmu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			cmu.Lock()
			conns = append(conns, c)
			cmu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				u.serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		cmu.Lock()
		for _, c := range conns {
			c.Close()
		}
		cmu.Unlock()
		wg.Wait()
	})
	return u
}

func (u *recordingUpstream) serve(c net.Conn) {
	br := bufio.NewReader(io.TeeReader(c, u))
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		u.mu.Lock()
		u.paths = append(u.paths, req.URL.Path)
		u.mu.Unlock()
		answer, _ := json.Marshal(map[string]any{"path": req.URL.Path, "body": string(body)})
		fmt.Fprintf(c, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(answer), answer)
	}
}

// Write records bytes received (the TeeReader's side).
func (u *recordingUpstream) Write(p []byte) (int, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.raw.Write(p)
}

// received returns the paths of the requests read and the raw bytes.
func (u *recordingUpstream) received() ([]string, string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.paths...), u.raw.String()
}

// rawReply is one response read from a raw connection.
type rawReply struct {
	status int
	header http.Header
	body   string
	// close is set when the response said Connection: close (which
	// net/http's reader removes from header).
	close bool
}

func (r rawReply) problemCode() string {
	var p struct{ Code string }
	_ = json.Unmarshal([]byte(r.body), &p)
	return p.Code
}

// rawExchange writes raw to a new connection to addr and reads responses
// until the connection ends. closed reports that the server closed it;
// false means it was still open when the 10 s deadline passed.
func rawExchange(t *testing.T, addr, raw string) (replies []rawReply, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			var ne net.Error
			return replies, !(errors.As(err, &ne) && ne.Timeout())
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatalf("reading a response body: %v", err)
		}
		replies = append(replies, rawReply{resp.StatusCode, resp.Header, string(body), resp.Close})
	}
}

// smuggled is the request an attacker hides after the body as the
// proxy's parser would read it.
const smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"

// smugglingCases are the framings a smuggler uses; each is followed by an
// empty chunked body and the hidden request.
var smugglingCases = []struct {
	name, header string
	status       int
}{
	{"CL then TE", "POST /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 41\r\nTransfer-Encoding: chunked\r\n", 400},
	{"TE then CL", "POST /pay HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n", 400},
	{"TE obs-folded", "POST /pay HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n", 400},
	{"TE folded into another field", "POST /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 41\r\nX-Pad: a\r\n\tTransfer-Encoding: chunked\r\n", 400},
	{"TE gzip, chunked", "POST /pay HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n", 400},
	{"TE chunked, identity", "POST /pay HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, identity\r\n", 400},
	{"TE twice", "POST /pay HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", 400},
	{"TE twice, one bogus", "POST /pay HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n", 400},
	{"TE with a tab", "POST /pay HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\tchunked\r\n", 400},
	{"TE in capitals", "POST /pay HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED\r\n", 400},
	{"TE with a space before the colon", "POST /pay HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n", 400},
	{"two different lengths", "POST /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 41\r\n", 400},
	{"two equal lengths", "POST /pay HTTP/1.1\r\nHost: x\r\nContent-Length: 41\r\nContent-Length: 41\r\n", 400},
	{"HTTP/1.0 with TE", "POST /pay HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n", 400},
	{"HTTP/1.0 with TE and CL", "POST /pay HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\nContent-Length: 41\r\nTransfer-Encoding: chunked\r\n", 400},
	{"HTTP/1.0 GET with TE", "GET /pay HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n", 400},
	{"header too large", "POST /pay HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 70<<10) + "\r\n", 431},
}

// checkRefused checks the answer to a refused request: one problem with
// the status and code, Connection: close, and the connection closed.
func checkRefused(t *testing.T, name string, replies []rawReply, closed bool, status int) {
	t.Helper()
	if len(replies) != 1 {
		t.Errorf("%s: %d responses, want the refusal alone: %+v", name, len(replies), replies)
		return
	}
	r := replies[0]
	code := CodeBadFraming
	if status == http.StatusRequestHeaderFieldsTooLarge {
		code = CodeHeaderTooLarge
	}
	if r.status != status || r.problemCode() != code || r.header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("%s: %d %s %q, want %d %s", name, r.status, r.header.Get("Content-Type"), r.body, status, code)
	}
	if !strings.Contains(r.header.Get("Link"), "docs/proxy.md#"+code) {
		t.Errorf("%s: Link %q does not point to the code's documentation", name, r.header.Get("Link"))
	}
	if !r.close {
		t.Errorf("%s: no Connection: close", name)
	}
	if !closed {
		t.Errorf("%s: the connection stayed open after the refusal", name)
	}
}

func TestSmugglingIsRefused(t *testing.T) {
	t.Parallel()
	up := newRecordingUpstream(t)
	u, _ := url.Parse(up.url)
	px := newTestProxy(t, nil, Config{Upstream: u})
	addr := strings.TrimPrefix(px.URL, "http://")
	for _, c := range smugglingCases {
		replies, closed := rawExchange(t, addr, c.header+"\r\n0\r\n\r\n"+smuggled)
		checkRefused(t, c.name, replies, closed, c.status)
	}
	if paths, raw := up.received(); len(paths) != 0 || raw != "" {
		t.Fatalf("the upstream received %v:\n%s", paths, raw)
	}

	// Behind a good request on the same connection: the good one is
	// forwarded and answered, the bad one refused, the hidden one never
	// read.
	good := "GET /first HTTP/1.1\r\nHost: x\r\n\r\n"
	replies, closed := rawExchange(t, addr, good+smugglingCases[0].header+"\r\n0\r\n\r\n"+smuggled)
	if len(replies) != 2 || replies[0].status != http.StatusCreated {
		t.Fatalf("pipelined: %+v", replies)
	}
	checkRefused(t, "pipelined", replies[1:], closed, 400)
	if paths, raw := up.received(); len(paths) != 1 || paths[0] != "/first" || strings.Contains(raw, "smuggled") {
		t.Fatalf("the upstream received %v:\n%s", paths, raw)
	}
}

// TestSmugglingIsRefusedWithAKey: the same with the Idempotency-Key and
// credential of a real client, so that a protected request would be
// claimed and forwarded if the guard let it through: nothing is claimed
// (the key is free afterwards) and nothing forwarded.
func TestSmugglingIsRefusedWithAKey(t *testing.T) {
	t.Parallel()
	up := newRecordingUpstream(t)
	u, _ := url.Parse(up.url)
	px := newTestProxy(t, nil, Config{Upstream: u})
	addr := strings.TrimPrefix(px.URL, "http://")
	key := newKey(t)
	head := "POST /pay HTTP/1.1\r\nHost: x\r\nAuthorization: " + testCredential + "\r\nIdempotency-Key: " + key + "\r\nContent-Type: application/json\r\n"
	for _, framing := range []string{
		"Content-Length: 15\r\nTransfer-Encoding: chunked\r\n",
		"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
	} {
		replies, closed := rawExchange(t, addr, head+framing+"\r\n"+"b\r\n{\"amount\":1}\r\n0\r\n\r\n"+smuggled)
		checkRefused(t, framing, replies, closed, 400)
	}
	if paths, _ := up.received(); len(paths) != 0 {
		t.Fatalf("the upstream received %v", paths)
	}
	// The key was never claimed: the first well-framed request runs.
	r := send(t, http.MethodPost, px.URL+"/pay", `{"amount":1}`, idem.HeaderKey, key)
	if r.status != http.StatusCreated || r.header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("first well-framed request: %v", r)
	}
}

// TestWellFramedRequestsPass: what clients send, pipelined on one
// connection, reaches the upstream whole and in order.
func TestWellFramedRequestsPass(t *testing.T) {
	t.Parallel()
	up := newRecordingUpstream(t)
	u, _ := url.Parse(up.url)
	px := newTestProxy(t, nil, Config{Upstream: u})
	key := newKey(t)
	stream := "GET /a HTTP/1.1\r\nHost: x\r\n\r\n" +
		"PUT /b HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello" +
		"PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:  chunked \r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nX-Checksum: 1\r\n\r\n" +
		"POST /d HTTP/1.1\r\nHost: x\r\nAuthorization: " + testCredential + "\r\nIdempotency-Key: " + key + "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n" +
		"\r\n" + // the stray line break some old clients send after a POST
		"PATCH /e HTTP/1.0\r\nContent-Length: 2\r\n\r\nok"
	replies, closed := rawExchange(t, strings.TrimPrefix(px.URL, "http://"), stream)
	if !closed || len(replies) != 5 {
		t.Fatalf("closed %v, %d replies: %+v", closed, len(replies), replies)
	}
	for i, want := range []string{`"body":"","path":"/a"`, `"body":"hello","path":"/b"`, `"body":"abcde","path":"/c"`, `"body":"{\"a\":1}","path":"/d"`} {
		if replies[i].status != http.StatusCreated || !strings.Contains(replies[i].body, want) {
			t.Errorf("reply %d: %+v, want %s", i, replies[i], want)
		}
	}
	// PATCH needs a key: the core refuses it, well framed.
	if replies[4].status != http.StatusBadRequest || replies[4].problemCode() != idem.CodeKeyMissing {
		t.Errorf("reply 4: %+v", replies[4])
	}
	if paths, _ := up.received(); strings.Join(paths, " ") != "/a /b /c /d" {
		t.Fatalf("the upstream received %v", paths)
	}
}

// TestBadChunkedBodyClosesTheConnection: a chunked body whose framing is
// invalid after a good header ends the connection: what follows it is
// never read as a request.
func TestBadChunkedBodyClosesTheConnection(t *testing.T) {
	t.Parallel()
	up := newRecordingUpstream(t)
	u, _ := url.Parse(up.url)
	px := newTestProxy(t, nil, Config{Upstream: u})
	for name, body := range map[string]string{
		"bare LF":         "5\nhello\r\n0\r\n\r\n",
		"data overrun":    "2\r\nhello\r\n0\r\n\r\n",
		"folded trailer":  "0\r\nX: a\r\n b\r\n\r\n",
		"trailer request": "0\r\nGET /smuggled HTTP/1.1\r\n\r\n",
	} {
		replies, closed := rawExchange(t, strings.TrimPrefix(px.URL, "http://"),
			"PUT /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"+body+smuggled)
		if !closed {
			t.Errorf("%s: the connection stayed open", name)
		}
		if len(replies) != 1 || replies[0].status != http.StatusBadRequest || replies[0].problemCode() != CodeBadFraming || !replies[0].close {
			t.Errorf("%s: %+v, want one 400 %s with Connection: close", name, replies, CodeBadFraming)
		}
	}
	// A protected body is read whole before anything is claimed: the
	// core refuses it, and nothing is forwarded.
	replies, closed := rawExchange(t, strings.TrimPrefix(px.URL, "http://"),
		"POST /c HTTP/1.1\r\nHost: x\r\nAuthorization: a\r\nIdempotency-Key: k\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n"+smuggled)
	if !closed || len(replies) != 1 || replies[0].status != http.StatusBadRequest || replies[0].problemCode() != idem.CodeBodyInvalid {
		t.Errorf("protected: closed %v, %+v", closed, replies)
	}
	if paths, raw := up.received(); strings.Contains(strings.Join(paths, " "), "smuggled") || strings.Contains(raw, "/smuggled") {
		t.Fatalf("the upstream received %v:\n%s", paths, raw)
	}
}

// TestRefusalCannotBeForged: a client that sends the stand-in's marker
// field itself is served as usual; only the framer's own token refuses.
func TestRefusalCannotBeForged(t *testing.T) {
	t.Parallel()
	up := newRecordingUpstream(t)
	u, _ := url.Parse(up.url)
	px := newTestProxy(t, nil, Config{Upstream: u, Logger: slog.New(slog.DiscardHandler)})
	r := send(t, http.MethodGet, px.URL+"/a", "", refusalHeader, "guess")
	if r.status != http.StatusCreated {
		t.Fatalf("a request with a forged marker: %v", r)
	}
}

// TestProcessRefusesSmuggling drives the idem binary: `idem proxy`
// refuses every smuggling framing over a raw socket, closes the
// connection, logs the refusal, and the raw upstream never sees a byte of
// it; a well-framed chunked request still goes through.
func TestProcessRefusesSmuggling(t *testing.T) {
	t.Parallel()
	up := newRecordingUpstream(t)
	p := startProxy(t, "proxy", "--upstream", up.url, "--store", "memory")
	addr := strings.TrimPrefix(p.url, "http://")
	for _, c := range smugglingCases {
		replies, closed := rawExchange(t, addr, c.header+"\r\n0\r\n\r\n"+smuggled)
		checkRefused(t, c.name, replies, closed, c.status)
	}
	good := "PUT /ok HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
	replies, closed := rawExchange(t, addr, good+smugglingCases[0].header+"\r\n0\r\n\r\n"+smuggled)
	if len(replies) != 2 || replies[0].status != http.StatusCreated || !strings.Contains(replies[0].body, `"body":"ok"`) {
		t.Fatalf("pipelined: %+v", replies)
	}
	checkRefused(t, "pipelined", replies[1:], closed, 400)
	if paths, raw := up.received(); len(paths) != 1 || paths[0] != "/ok" || strings.Contains(raw, "smuggled") {
		t.Fatalf("the upstream received %v:\n%s", paths, raw)
	}
	line := p.waitLog(t, `"reason":"the request has both Content-Length and Transfer-Encoding"`)
	if !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, `"path":"/pay"`) {
		t.Fatalf("refusal log line: %s", line)
	}
}
