package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

func TestCheckHeader(t *testing.T) {
	t.Parallel()
	const start = "POST /p HTTP/1.1\r\nHost: x\r\n"
	cases := []struct {
		name   string
		block  string
		refuse string // part of the reason; "" to accept
		want   framing
	}{
		{"no body", "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "", framing{}},
		{"content-length", start + "Content-Length: 12\r\n\r\n", "", framing{length: 12}},
		{"content-length with spaces", start + "content-length:   12  \r\n\r\n", "", framing{length: 12}},
		{"content-length zero", start + "Content-Length: 0\r\n\r\n", "", framing{}},
		{"chunked", start + "Transfer-Encoding: chunked\r\n\r\n", "", framing{chunked: true}},
		{"chunked, field name in any case", start + "TRANSFER-encoding: chunked\r\n\r\n", "", framing{chunked: true}},
		{"bare LF line endings", "POST /p HTTP/1.1\nHost: x\nContent-Length: 3\n\n", "", framing{length: 3}},
		{"HTTP/1.0 with a length", "POST /p HTTP/1.0\r\nContent-Length: 3\r\n\r\n", "", framing{length: 3}},
		{"obs-text in a value", start + "X-Name: caf\xc3\xa9\r\n\r\n", "", framing{}},

		{"CL and TE", start + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n", "both Content-Length and Transfer-Encoding", framing{}},
		{"TE and CL", start + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n", "both Content-Length and Transfer-Encoding", framing{}},
		{"two lengths", start + "Content-Length: 4\r\nContent-Length: 40\r\n\r\n", "more than one Content-Length", framing{}},
		{"two equal lengths", start + "Content-Length: 4\r\nContent-Length: 4\r\n\r\n", "more than one Content-Length", framing{}},
		{"length list", start + "Content-Length: 4, 4\r\n\r\n", "not one decimal number", framing{}},
		{"signed length", start + "Content-Length: +4\r\n\r\n", "not one decimal number", framing{}},
		{"hex length", start + "Content-Length: 0x4\r\n\r\n", "not one decimal number", framing{}},
		{"empty length", start + "Content-Length: \r\n\r\n", "not one decimal number", framing{}},
		{"huge length", start + "Content-Length: 9223372036854775808\r\n\r\n", "not one decimal number", framing{}},
		{"length with a tab", start + "Content-Length:\t4\r\n\r\n", "not one decimal number", framing{}},
		{"TE gzip, chunked", start + "Transfer-Encoding: gzip, chunked\r\n\r\n", `not exactly "chunked"`, framing{}},
		{"TE chunked, identity", start + "Transfer-Encoding: chunked, identity\r\n\r\n", `not exactly "chunked"`, framing{}},
		{"TE identity", start + "Transfer-Encoding: identity\r\n\r\n", `not exactly "chunked"`, framing{}},
		{"TE twice", start + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", "more than one Transfer-Encoding", framing{}},
		{"TE with a tab", start + "Transfer-Encoding:\tchunked\r\n\r\n", `not exactly "chunked"`, framing{}},
		{"TE with a trailing tab", start + "Transfer-Encoding: chunked\t\r\n\r\n", `not exactly "chunked"`, framing{}},
		{"TE in capitals", start + "Transfer-Encoding: Chunked\r\n\r\n", `not exactly "chunked"`, framing{}},
		{"TE xchunked", start + "Transfer-Encoding: xchunked\r\n\r\n", `not exactly "chunked"`, framing{}},
		{"TE empty", start + "Transfer-Encoding: \r\n\r\n", `not exactly "chunked"`, framing{}},
		{"TE with a vertical tab", start + "Transfer-Encoding: chunked\v\r\n\r\n", "control character", framing{}},
		{"TE folded", start + "Transfer-Encoding:\r\n chunked\r\n\r\n", "obs-fold", framing{}},
		{"TE folded into another field", start + "Content-Length: 4\r\nX-Pad: a\r\n\tTransfer-Encoding: chunked\r\n\r\n", "obs-fold", framing{}},
		{"first field folded", "POST /p HTTP/1.1\r\n Transfer-Encoding: chunked\r\n\r\n", "obs-fold", framing{}},
		{"space before colon", start + "Transfer-Encoding : chunked\r\n\r\n", "not a field name", framing{}},
		{"no colon", start + "Transfer-Encoding chunked\r\n\r\n", "not a field name", framing{}},
		{"CR in a value", start + "X-A: b\rTransfer-Encoding: chunked\r\n\r\n", "control character", framing{}},
		{"NUL in a value", start + "X-A: b\x00\r\n\r\n", "control character", framing{}},
		{"HTTP/1.0 with TE", "POST /p HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.0 request has Transfer-Encoding", framing{}},
		{"HTTP/1.0 with TE and CL", "POST /p HTTP/1.0\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n", "both", framing{}},
		{"HTTP/1.2", "POST /p HTTP/1.2\r\nHost: x\r\n\r\n", "HTTP version", framing{}},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\n", "HTTP version", framing{}},
		{"double space", "POST  /p HTTP/1.1\r\nHost: x\r\n\r\n", "request line", framing{}},
		{"tab in target", "POST /p\tq HTTP/1.1\r\nHost: x\r\n\r\n", "request line", framing{}},
		{"no version", "POST /p\r\nHost: x\r\n\r\n", "request line", framing{}},
		{"bad method", "PO(ST /p HTTP/1.1\r\nHost: x\r\n\r\n", "request line", framing{}},
	}
	for _, c := range cases {
		fr, ref := checkHeader([]byte(c.block))
		switch {
		case c.refuse == "" && ref != nil:
			t.Errorf("%s: refused (%s), want accepted", c.name, ref.reason)
		case c.refuse == "" && fr != c.want:
			t.Errorf("%s: framing %+v, want %+v", c.name, fr, c.want)
		case c.refuse != "" && ref == nil:
			t.Errorf("%s: accepted (%+v), want refused for %q", c.name, fr, c.refuse)
		case c.refuse != "" && (!strings.Contains(ref.reason, c.refuse) || ref.status != http.StatusBadRequest):
			t.Errorf("%s: refused %d for %q, want 400 for %q", c.name, ref.status, ref.reason, c.refuse)
		}
	}
}

func TestParseChunkLine(t *testing.T) {
	t.Parallel()
	for line, want := range map[string]int64{
		"5\r\n": 5, "1a\r\n": 26, "1A;name=value\r\n": 26, "0\r\n": 0, "000\r\n": 0,
		"ffffffffffffffff\r\n": -1, // the largest 16 digits
		"5;ext\twith tab\r\n":  5,
		// refused (net/http accepts the first four; the framer is stricter)
		"5 \r\n": -2, "5\t\r\n": -2, "5 ;x\r\n": -2, "5;x\x00\r\n": -2,
		"5\n": -2, "5\r\r\n": -2, "\r\n": -2, "x\r\n": -2, "-5\r\n": -2, "0x5\r\n": -2,
		"10000000000000000\r\n": -2, // 17 digits
	} {
		n, ok := parseChunkLine([]byte(line))
		switch {
		case want == -2 && ok:
			t.Errorf("%q: accepted as %d, want refused", line, n)
		case want == -1 && (!ok || n != ^uint64(0)):
			t.Errorf("%q: %d %v", line, n, ok)
		case want >= 0 && (!ok || n != uint64(want)):
			t.Errorf("%q: %d %v, want %d", line, n, ok, want)
		}
	}
}

// scan runs a framer over stream, split into pieces of at most step
// bytes, and returns what the server would read, the request ends it
// reported, and the framer.
func scan(stream string, step int) (string, []int64, *framer) {
	f := newFramer(1 << 10)
	var ends []int64
	f.boundary = func(end int64) { ends = append(ends, end) }
	var got []byte
	for b := []byte(stream); len(b) > 0; {
		n := min(step, len(b))
		piece := append([]byte(nil), b[:n]...)
		b = b[n:]
		k := f.feed(piece)
		got = append(got, piece[:k]...)
		got = append(got, f.pending()...)
		f.consumed(len(f.pending()))
	}
	return string(got), ends, f
}

func TestFramerFollowsMessages(t *testing.T) {
	t.Parallel()
	reqs := []string{
		"GET /a HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello",
		"\r\n", // a stray line break after a POST body, which net/http skips
		"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n1A\r\n" + strings.Repeat("z", 26) + "\r\n0\r\nX-Sum: 1\r\nX-Other: 2\r\n\r\n",
		"PUT /d HTTP/1.1\nHost: x\nContent-Length: 2\n\nok",
		"POST /e HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	}
	stream := strings.Join(reqs, "")
	var want []int64
	var at int64
	for _, r := range reqs {
		at += int64(len(r))
		if r != "\r\n" {
			want = append(want, at)
		}
	}
	// /c's end counts the stray CRLF before it.
	for _, step := range []int{1, 2, 3, 7, 64, len(stream)} {
		got, ends, f := scan(stream, step)
		if got != stream || f.state != stHeader || f.refusal != nil || f.broken != "" {
			t.Fatalf("step %d: delivered %q (state %d, refusal %v, broken %q)", step, got, f.state, f.refusal, f.broken)
		}
		if len(ends) != len(want) {
			t.Fatalf("step %d: ends %v, want %v", step, ends, want)
		}
		for i := range want {
			if ends[i] != want[i] {
				t.Fatalf("step %d: ends %v, want %v", step, ends, want)
			}
		}
	}
}

func TestFramerRefusesAndStops(t *testing.T) {
	t.Parallel()
	good := "GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"
	bad := "POST /smuggle?q=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 41\r\nTransfer-Encoding: chunked\r\n\r\n"
	after := "0\r\n\r\nGET /hidden HTTP/1.1\r\nHost: x\r\n\r\n"
	for _, step := range []int{1, 5, 1000} {
		got, _, f := scan(good+bad+after, step)
		if f.refusal == nil || f.state != stRefused {
			t.Fatalf("step %d: not refused: %q", step, got)
		}
		if !strings.HasPrefix(got, good) || strings.Contains(got, "hidden") || strings.Contains(got, "Content-Length") {
			t.Fatalf("step %d: delivered %q", step, got)
		}
		// What follows the good request is the stand-in: one request, no
		// body, the refused method and target, the token.
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader(strings.TrimPrefix(got, good))))
		if err != nil {
			t.Fatalf("step %d: the stand-in does not parse: %v", step, err)
		}
		if req.Method != http.MethodPost || req.URL.RequestURI() != "/smuggle?q=1" || req.ContentLength != 0 ||
			req.Header.Get(refusalHeader) != f.refusal.token || len(f.refusal.token) < 20 {
			t.Fatalf("step %d: stand-in %s %s, length %d, token %q", step, req.Method, req.URL, req.ContentLength, req.Header.Get(refusalHeader))
		}
	}
}

func TestFramerStandInRequest(t *testing.T) {
	t.Parallel()
	for stream, want := range map[string]string{
		"OPTIONS * HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n": "OPTIONS / HTTP/1.1", // net/http answers OPTIONS * itself
		"GET /a HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n":                "GET /a HTTP/1.0",
		"PRI * HTTP/2.0\r\n\r\n":                                  "PRI / HTTP/1.1",
		"G(T /a HTTP/1.1\r\n\r\n":                                 "GET /a HTTP/1.1", // the method is not a token
		"GET http://h/x HTTP/1.1\r\nTransfer-Encoding: x\r\n\r\n": "GET / HTTP/1.1",
		"CONNECT h:443 HTTP/1.1\r\nTransfer-Encoding: x\r\n\r\n":  "CONNECT / HTTP/1.1",
		"GET /" + strings.Repeat("a", 2000):                       "GET / HTTP/1.1", // too large, no request line yet
		"GET /big HTTP/1.1\r\nX: " + strings.Repeat("a", 2000):    "GET /big HTTP/1.1",
	} {
		got, _, f := scan(stream, 100)
		name := stream[:min(len(stream), 20)]
		if f.refusal == nil {
			t.Errorf("%q: not refused", name)
			continue
		}
		if line, _, _ := strings.Cut(got, "\r\n"); line != want {
			t.Errorf("%q: stand-in %q, want %q", name, line, want)
		}
		if _, err := http.ReadRequest(bufio.NewReader(strings.NewReader(got))); err != nil {
			t.Errorf("%q: stand-in %q does not parse: %v", name, got, err)
		}
		if big := strings.Contains(stream, "aaaa"); big != (f.refusal.status == http.StatusRequestHeaderFieldsTooLarge) {
			t.Errorf("%q: status %d", name, f.refusal.status)
		}
	}
}

func TestFramerBreaksOnBadChunks(t *testing.T) {
	t.Parallel()
	head := "POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
	for name, body := range map[string]string{
		"bare LF after size":      "5\nhello\r\n0\r\n\r\n",
		"no CRLF after data":      "5\r\nhelloX\r\n0\r\n\r\n",
		"LF only after data":      "5\r\nhello\n0\r\n\r\n",
		"space after size":        "5 \r\nhello\r\n0\r\n\r\n",
		"not hex":                 "g\r\nhello\r\n0\r\n\r\n",
		"long chunk line":         "5;" + strings.Repeat("e", maxChunkLine) + "\r\nhello\r\n0\r\n\r\n",
		"folded trailer":          "0\r\nX: a\r\n b\r\n\r\n",
		"trailer with LF only":    "0\r\nX: a\n\r\n",
		"trailer without a colon": "0\r\nGET /hidden HTTP/1.1\r\n\r\n",
		"long trailer":            "0\r\nX: " + strings.Repeat("t", maxTrailerBytes) + "\r\n\r\n",
	} {
		got, _, f := scan(head+body+"GET /hidden HTTP/1.1\r\nHost: x\r\n\r\n", 3)
		if f.state != stBroken || f.broken == "" {
			t.Errorf("%s: state %d, delivered %q", name, f.state, got)
		}
		if strings.Contains(got, "GET /hidden") {
			t.Errorf("%s: delivered the next request: %q", name, got)
		}
	}
}

// TestFramerReadsLikeNetHTTP runs net/http's own request parser over what
// the framer delivers for a few streams a smuggler would send, and checks
// that it finds the same requests and never one the framer did not pass.
func TestFramerReadsLikeNetHTTP(t *testing.T) {
	t.Parallel()
	for _, stream := range []string{
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /hidden HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /next HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET / HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /hidden HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		checkAgainstNetHTTP(t, []byte(stream), 4)
	}
}

// checkAgainstNetHTTP feeds stream to a framer through a guardConn, step
// bytes per read, and parses what the server would read as net/http's
// server does: every request net/http completes must end where the framer
// says one ends, and the requests must be the framer's, in order.
func checkAgainstNetHTTP(t *testing.T, stream []byte, step int) {
	t.Helper()
	f := newFramer(4 << 10)
	var ends []int64
	f.boundary = func(end int64) { ends = append(ends, end) }
	c := &guardConn{Conn: &pieceConn{data: stream, step: step}, f: f}
	var delivered bytes.Buffer
	// Read everything the framer lets through first, in reads of varying
	// size: the server reads ahead, so its parse may come after the
	// framer saw more.
	buf := make([]byte, 64)
	for i := 0; ; i++ {
		n, err := c.Read(buf[:1+(i*7+step)%len(buf)])
		delivered.Write(buf[:n])
		if err != nil {
			break
		}
	}
	// The stand-in request of a refusal is not the client's: net/http's
	// view of the client's requests ends where it starts. The bytes that
	// replace a broken body's invalid unit stay: net/http must reject
	// them.
	got := delivered.Bytes()
	if f.refusal != nil {
		i := bytes.LastIndex(got, f.refusal.synthetic())
		if i < 0 {
			t.Fatalf("the refusal's stand-in is not at the end of %q", got)
		}
		got = got[:i]
	}
	clients := got
	if f.broken != "" {
		if !bytes.HasSuffix(got, []byte(f.injected)) {
			t.Fatalf("a broken body does not end with %q: %q", f.injected, got)
		}
		clients = got[:len(got)-len(f.injected)]
	}
	if !bytes.HasPrefix(stream, clients) {
		t.Fatalf("the framer changed the client's bytes:\n got %q\nfrom %q", clients, stream)
	}
	for i, end := range netHTTPEnds(got) {
		if i >= len(ends) || end != ends[i] {
			t.Fatalf("net/http found a request ending at %d (request %d), the framer's end at %v, in %q", end, i, ends, got)
		}
	}
}

// netHTTPEnds parses stream as net/http's server reads a connection
// (discarding up to four CR or LF bytes after a POST, reading each body to
// its end, stopping at an error or after a request that closes the
// connection) and returns the offset at which each complete request ends.
func netHTTPEnds(stream []byte) []int64 {
	cr := &countingReader{r: bytes.NewReader(stream)}
	br := bufio.NewReader(cr)
	var ends []int64
	lastPOST := false
	for {
		if lastPOST {
			peek, _ := br.Peek(4)
			skip := 0
			for skip < len(peek) && (peek[skip] == '\r' || peek[skip] == '\n') {
				skip++
			}
			br.Discard(skip)
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			return ends
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return ends
		}
		ends = append(ends, cr.n-int64(br.Buffered()))
		if req.Close {
			return ends
		}
		lastPOST = req.Method == http.MethodPost
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// pieceConn is a connection whose reads return its data step bytes at a
// time, then io.EOF.
type pieceConn struct {
	net.Conn // nil: only Read is used
	data     []byte
	step     int
}

func (c *pieceConn) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.data[:min(c.step, len(c.data))])
	c.data = c.data[n:]
	return n, nil
}

// BenchmarkFramer measures the framer on what the proxy's clients send: a
// protected POST (a 52-byte JSON body with its header) and a 64 KiB
// chunked upload, fed as 4 KiB reads, as net/http reads a connection.
//
//	go test -run '^$' -bench BenchmarkFramer ./internal/proxy/
func BenchmarkFramer(b *testing.B) {
	post := "POST /payments HTTP/1.1\r\nHost: proxy.internal:8080\r\nUser-Agent: Go-http-client/1.1\r\n" +
		"Content-Length: 52\r\nAuthorization: Bearer sk_test_4eC39HqLyjWDarjtT1zdp7dc\r\n" +
		"Content-Type: application/json\r\nIdempotency-Key: \"5e2c1f7a-9d0b-4c55-8f1e-2a8f3f0d6b11\"\r\n" +
		"Accept-Encoding: gzip\r\n\r\n" + `{"amount":100,"currency":"EUR","customer":"cus_42"}` + "\n"
	var upload strings.Builder
	upload.WriteString("PUT /files/1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
	for range 16 {
		fmt.Fprintf(&upload, "1000\r\n%s\r\n", strings.Repeat("u", 4096))
	}
	upload.WriteString("0\r\n\r\n")
	for _, c := range []struct{ name, stream string }{
		{"post", strings.Repeat(post, 64)},
		{"chunked-upload", upload.String()},
	} {
		b.Run(c.name, func(b *testing.B) {
			stream := []byte(c.stream)
			buf := make([]byte, 4096)
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				f := newFramer(64 << 10)
				for s := stream; len(s) > 0; {
					n := copy(buf, s)
					s = s[n:]
					f.feed(buf[:n])
					f.consumed(len(f.pending()))
				}
				if f.state != stHeader {
					b.Fatalf("state %d", f.state)
				}
			}
		})
	}
}
