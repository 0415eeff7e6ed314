package proxy

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
)

// Request framing, checked on the bytes (RFC 9112 section 6.3).
//
// Go's HTTP/1 server settles an ambiguous request length by itself and
// hides the evidence from handlers. With both Content-Length and
// Transfer-Encoding: chunked it reads the body as chunked and deletes
// Content-Length; on HTTP/1.0 it ignores and deletes Transfer-Encoding; it
// joins obs-folded lines into one value. Then it keeps the connection open
// and reads whatever follows the body, as it reckoned the body, as the
// next request. A front end that reckons the same bytes the other way
// hands the proxy a second request hidden in the first one's body, and
// the proxy forwards it (request smuggling). A handler cannot tell such a
// request from a plain chunked one, so the check runs on the connection,
// before net/http parses anything: framer follows the inbound bytes of one
// connection and lets through only requests whose length cannot be read
// two ways.
//
// What framer accepts is a subset of what net/http accepts, and on that
// subset both find the same message boundaries (FuzzFramingMatchesNetHTTP
// checks it against net/http's own parser):
//
//   - a request line "METHOD SP TARGET SP HTTP/1.1" (or HTTP/1.0), after
//     any empty lines;
//   - field lines "name: value": a token name, no line folding, no control
//     characters but HTAB in the value; lines end with LF or CRLF, as
//     net/http's own reader takes them;
//   - at most one Content-Length, a decimal number with spaces around it
//     at most; at most one Transfer-Encoding, exactly "chunked" (lower
//     case, spaces around it at most), never with Content-Length, never on
//     HTTP/1.0;
//   - a chunked body whose lines all end with CRLF: chunk sizes of 1 to 16
//     hex digits with an optional ";extension", and trailer fields as
//     above.
//
// A header outside that subset is refused: the server reads a short
// stand-in request instead (see synthetic), which the guard's handler
// answers 400 proxy.bad_framing (431 for a header above the limit) with
// Connection: close, and nothing after it reaches the server. A chunked
// body outside it ends where it breaks (see breakOff): net/http's read of
// the body fails and it closes the connection after its answer; the
// request was already forwarded as far as its body went.

// scanState is where a framer is in the byte stream.
type scanState uint8

const (
	stHeader    scanState = iota // reading a request header block
	stLength                     // in a Content-Length body
	stChunkSize                  // reading a chunk-size line
	stChunkData                  // in a chunk's data
	stChunkEnd                   // reading the CRLF after a chunk's data
	stTrailer                    // reading the trailer section
	stRefused                    // a header was refused; nothing more is delivered
	stBroken                     // a body's framing was invalid; nothing more is delivered
)

// Limits of the lines framer holds while it checks them. Each is below
// the one net/http applies to the same bytes (4 KiB for a chunk line, its
// read buffer for the trailer section), so that what framer lets through
// net/http can parse whole.
const (
	maxChunkLine    = 1 << 10
	maxTrailerBytes = 4 << 10
)

// framer follows the framing of one connection's inbound bytes. feed
// takes the bytes as they are read and says which of them the server may
// read; the bytes of a header block and of chunk and trailer lines are
// held until they are complete and checked, body bytes pass at once.
type framer struct {
	// maxHeader bounds a header block (the request line, the field
	// lines and the empty line): a larger one is refused with 431.
	maxHeader int

	state scanState
	// unit holds the header block, chunk line or trailer section being
	// read; lineStart is where its last incomplete line starts.
	unit      []byte
	lineStart int
	// reqStart is where the request line starts in unit, after any empty
	// lines, or -1 before it.
	reqStart int
	// remaining counts the bytes left in a Content-Length body or a chunk.
	remaining uint64

	// out holds checked bytes the server has not read yet, from outPos.
	out    []byte
	outPos int

	// refusal is set when a header is refused; broken when a body's
	// framing was invalid.
	refusal *refusal
	broken  string
	// injected is what breakOff handed the server in place of an invalid
	// unit.
	injected string

	// boundary, if set, is told the stream offset at which each request
	// (header and body) ends: a test hook.
	boundary func(end int64)
	offset   int64 // bytes fed so far, for boundary
}

func newFramer(maxHeader int) *framer {
	return &framer{maxHeader: maxHeader, reqStart: -1}
}

// feed consumes b, bytes just read from the connection, and returns how
// many of its first bytes the server may read where they are. The rest
// of b is held by the framer or copied to its output (pending), which
// follows those first bytes in the stream.
func (f *framer) feed(b []byte) int {
	inPlace, direct := 0, true
	for len(b) > 0 {
		switch f.state {
		case stLength, stChunkData:
			n := len(b)
			if uint64(n) > f.remaining {
				n = int(f.remaining)
			}
			if direct {
				inPlace += n
			} else {
				f.out = append(f.out, b[:n]...)
			}
			b = b[n:]
			f.offset += int64(n)
			f.remaining -= uint64(n)
			if f.remaining == 0 {
				if f.state == stLength {
					f.state = stHeader
					f.ended()
				} else {
					f.state = stChunkEnd
				}
			}
		case stRefused, stBroken:
			return inPlace // discarded
		default:
			direct = false
			b = b[f.take(b):]
		}
	}
	return inPlace
}

// pending returns the checked bytes the server has not read yet.
func (f *framer) pending() []byte { return f.out[f.outPos:] }

// consumed records that the server read n bytes of pending.
func (f *framer) consumed(n int) {
	f.outPos += n
	if f.outPos == len(f.out) {
		f.out, f.outPos = f.out[:0], 0
		if cap(f.out) > 16<<10 {
			f.out = nil // a large header or trailer: not kept per idle connection
		}
	}
}

// ended reports a request's end to the test hook.
func (f *framer) ended() {
	if f.boundary != nil {
		f.boundary(f.offset)
	}
}

// limit is the size the current unit may reach.
func (f *framer) limit() int {
	switch f.state {
	case stHeader:
		return f.maxHeader
	case stChunkSize:
		return maxChunkLine
	case stChunkEnd:
		return 2
	default:
		return maxTrailerBytes
	}
}

// take consumes b's bytes up to and including its first line feed (all of
// b without one) into the current unit, and returns how many it took.
func (f *framer) take(b []byte) int {
	n := len(b)
	i := bytes.IndexByte(b, '\n')
	if i >= 0 {
		n = i + 1
	}
	if len(f.unit)+n > f.limit() {
		if f.state == stHeader {
			f.refuse(f.tooLarge())
		} else {
			f.breakOff("a chunk line or the trailer section is too long")
		}
		return len(b)
	}
	f.unit = append(f.unit, b[:n]...)
	f.offset += int64(n)
	if i >= 0 {
		line := f.unit[f.lineStart:]
		f.lineStart = len(f.unit)
		f.endLine(line)
	}
	return n
}

// endLine handles a complete line of the current unit (with its line
// feed).
func (f *framer) endLine(line []byte) {
	switch f.state {
	case stHeader:
		f.headerLine(line)
	case stChunkSize:
		size, ok := parseChunkLine(line)
		if !ok {
			f.breakOff("a chunk-size line is malformed")
			return
		}
		f.deliver()
		if size == 0 {
			f.state = stTrailer
		} else {
			f.state, f.remaining = stChunkData, size
		}
	case stChunkEnd:
		if string(line) != "\r\n" {
			f.breakOff("a chunk's data is not followed by CRLF")
			return
		}
		f.deliver()
		f.state = stChunkSize
	case stTrailer:
		if !crlfOnly(line) {
			f.breakOff("a trailer line does not end with CRLF")
			return
		}
		content := line[:len(line)-2]
		if len(content) > 0 {
			if reason := checkFieldLine(content); reason != "" {
				f.breakOff("the trailer section is malformed: " + reason)
			}
			return
		}
		f.deliver()
		f.state = stHeader
		f.ended()
	}
}

// headerLine handles a line of a header block.
func (f *framer) headerLine(line []byte) {
	empty := len(trimEOL(line)) == 0
	if f.reqStart < 0 {
		if !empty {
			f.reqStart = len(f.unit) - len(line)
		}
		return // empty lines before a request line are skipped, as net/http does after a POST
	}
	if !empty {
		return
	}
	fr, ref := checkHeader(f.unit[f.reqStart:])
	if ref != nil {
		f.refuse(ref)
		return
	}
	f.deliver()
	switch {
	case fr.chunked:
		f.state = stChunkSize
	case fr.length > 0:
		f.state, f.remaining = stLength, fr.length
	default:
		f.ended()
	}
}

// deliver moves the current unit to the output and starts a new one.
func (f *framer) deliver() {
	f.out = append(f.out, f.unit...)
	f.resetUnit()
}

func (f *framer) resetUnit() {
	f.unit, f.lineStart, f.reqStart = f.unit[:0], 0, -1
	if cap(f.unit) > 16<<10 {
		f.unit = nil
	}
}

// refuse replaces the current header block with the stand-in request of
// ref and stops delivering the connection's bytes.
func (f *framer) refuse(ref *refusal) {
	f.out = append(f.out, ref.synthetic()...)
	f.refusal = ref
	f.state = stRefused
	f.unit = nil
}

// breakOff stops the stream inside a body whose framing is invalid. In
// place of the invalid unit the server reads bytes its own chunked reader
// rejects in that place (a chunk size that is not hex, data not followed
// by CRLF, a trailer line without a colon), then nothing more: the
// request fails as a malformed chunked body does without the framer (its
// body read errs, net/http closes the connection after the answer), and
// the request's context stays alive for that answer.
func (f *framer) breakOff(reason string) {
	switch f.state {
	case stChunkSize:
		f.injected = "x\r\n"
	case stChunkEnd:
		f.injected = "xx"
	case stTrailer:
		f.injected = "x\r\n\r\n"
	}
	f.out = append(f.out, f.injected...)
	f.broken = reason
	f.state = stBroken
	f.unit = nil
}

// tooLarge is the refusal of a header block above maxHeader, named by
// its request line if that much has arrived.
func (f *framer) tooLarge() *refusal {
	ref := &refusal{status: http.StatusRequestHeaderFieldsTooLarge,
		reason: fmt.Sprintf("the request header is larger than %d bytes", f.maxHeader)}
	if f.reqStart >= 0 {
		if end := bytes.IndexByte(f.unit[f.reqStart:], '\n'); end >= 0 {
			ref.method, ref.target, ref.proto, _ = parseRequestLine(trimEOL(f.unit[f.reqStart : f.reqStart+end+1]))
		}
	}
	return ref
}

// framing is how a checked request's body is delimited.
type framing struct {
	chunked bool
	length  uint64 // with chunked false; 0 for no body
}

// refusal is a refused request header.
type refusal struct {
	status int    // 400, or 431 for a header above the limit
	reason string // what is wrong, for the problem's detail and the log
	// method, target and proto are the request line's, where it could be
	// read, for the stand-in request (and so the log).
	method, target, proto string
	// token marks the stand-in request as this refusal's (see synthetic).
	token string
}

// refusalHeader carries a refusal's token on its stand-in request.
const refusalHeader = "Idem-Framing-Refusal"

// synthetic returns the stand-in request the server reads in place of a
// refused header: the refused request's method and target where they are
// valid (for the access log), no body, and a random token that only this
// connection's framer knows, so that a client cannot forge a refusal. It
// keeps HTTP/1.0 for an HTTP/1.0 request, whose client may not read a
// chunked answer. Its target is never "*": net/http answers OPTIONS *
// itself.
func (r *refusal) synthetic() []byte {
	if r.token == "" {
		r.token = newRefusalToken()
	}
	method := r.method
	if !validToken(method) {
		method = http.MethodGet
	}
	target := r.target
	if len(target) == 0 || target[0] != '/' {
		target = "/"
	} else if _, err := url.ParseRequestURI(target); err != nil {
		target = "/"
	}
	proto := "HTTP/1.1"
	if r.proto == "HTTP/1.0" {
		proto = r.proto
	}
	return []byte(method + " " + target + " " + proto + "\r\nHost: framing-refused.invalid\r\n" +
		refusalHeader + ": " + r.token + "\r\n\r\n")
}

// checkHeader checks a header block: the request line, the field lines
// and the empty line, each with its line ending. It allocates only to
// refuse.
func checkHeader(block []byte) (framing, *refusal) {
	line, rest := nextLine(block)
	method, target, proto, ok := splitRequestLine(trimEOL(line))
	fail := func(reason string) (framing, *refusal) {
		return framing{}, &refusal{status: http.StatusBadRequest, reason: reason,
			method: string(method), target: string(target), proto: string(proto)}
	}
	if !ok {
		return fail("the request line is not METHOD, target and HTTP version separated by single spaces")
	}
	http10 := string(proto) == "HTTP/1.0"
	if !http10 && string(proto) != "HTTP/1.1" {
		return fail("the HTTP version is not HTTP/1.1 or HTTP/1.0")
	}
	// Folding first: a folded line changes what the line before it says.
	for r := rest; len(r) > 0; {
		line, r = nextLine(r)
		content := trimEOL(line)
		if len(content) == 0 {
			break // the empty line that ends the block
		}
		if content[0] == ' ' || content[0] == '\t' {
			return fail("a header field line is folded onto the next (obs-fold, RFC 9112 section 5.2)")
		}
	}
	var lengths, encodings int
	var fr framing
	for r := rest; len(r) > 0; {
		line, r = nextLine(r)
		content := trimEOL(line)
		if len(content) == 0 {
			break
		}
		if reason := checkFieldLine(content); reason != "" {
			return fail(reason)
		}
		name, value, _ := bytes.Cut(content, []byte{':'})
		switch {
		case asciiEqualFold(name, "content-length"):
			lengths++
			n, ok := parseContentLength(value)
			if !ok {
				return fail("the Content-Length field is not one decimal number")
			}
			fr.length = n
		case asciiEqualFold(name, "transfer-encoding"):
			encodings++
			if string(bytes.Trim(value, " ")) != "chunked" {
				return fail(`the Transfer-Encoding field is not exactly "chunked"`)
			}
			fr.chunked = true
		}
	}
	switch {
	case lengths > 1:
		return fail("the request has more than one Content-Length field")
	case encodings > 1:
		return fail("the request has more than one Transfer-Encoding field")
	case lengths > 0 && encodings > 0:
		return fail("the request has both Content-Length and Transfer-Encoding")
	case encodings > 0 && http10:
		return fail("an HTTP/1.0 request has Transfer-Encoding")
	}
	return fr, nil
}

// nextLine splits b after its first line feed (all of b without one).
func nextLine(b []byte) (line, rest []byte) {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		return b[:i+1], b[i+1:]
	}
	return b, nil
}

// splitRequestLine splits a request line into its three parts, each
// non-empty and free of spaces, tabs and control characters; ok also
// needs the method to be a token.
func splitRequestLine(line []byte) (method, target, proto []byte, ok bool) {
	method, rest, ok1 := bytes.Cut(line, []byte{' '})
	target, proto, ok2 := bytes.Cut(rest, []byte{' '})
	if !ok1 || !ok2 {
		return nil, nil, nil, false
	}
	for _, p := range [3][]byte{method, target, proto} {
		if len(p) == 0 || bytes.IndexByte(p, ' ') >= 0 || bytes.IndexByte(p, '\t') >= 0 || hasControl(p) {
			return method, target, proto, false
		}
	}
	return method, target, proto, validToken(method)
}

// parseRequestLine is splitRequestLine with strings, for a refusal.
func parseRequestLine(line []byte) (method, target, proto string, ok bool) {
	m, t, p, ok := splitRequestLine(line)
	return string(m), string(t), string(p), ok
}

// checkFieldLine checks a field line (without its line ending): a token
// name, a colon, a value without control characters other than HTAB. It
// returns what is wrong, or "".
func checkFieldLine(content []byte) string {
	name, value, ok := bytes.Cut(content, []byte{':'})
	if !ok || !validToken(name) {
		return "a header field line is not a field name, a colon and a value"
	}
	if hasControl(value) {
		return "a header field value contains a control character"
	}
	return ""
}

// hasControl reports whether b has a control character other than HTAB.
func hasControl(b []byte) bool {
	for _, c := range b {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return true
		}
	}
	return false
}

// parseContentLength parses a Content-Length value: decimal digits with
// spaces around them at most, below 2^63.
func parseContentLength(v []byte) (uint64, bool) {
	v = bytes.Trim(v, " ")
	if len(v) == 0 {
		return 0, false
	}
	var n uint64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
		if n >= 1<<63 {
			return 0, false
		}
	}
	return n, true
}

// parseChunkLine parses a chunk-size line (with its CRLF): 1 to 16 hex
// digits, then nothing or a chunk extension after a semicolon.
func parseChunkLine(line []byte) (uint64, bool) {
	if !crlfOnly(line) {
		return 0, false
	}
	size, ext, hasExt := bytes.Cut(line[:len(line)-2], []byte{';'})
	if len(size) == 0 || len(size) > 16 {
		return 0, false
	}
	var n uint64
	for _, c := range size {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		n = n<<4 | uint64(d)
	}
	if hasExt && hasControl(ext) {
		return 0, false
	}
	return n, true
}

// crlfOnly reports whether line ends with CRLF and has no other CR.
func crlfOnly(line []byte) bool {
	n := len(line)
	return n >= 2 && line[n-2] == '\r' && line[n-1] == '\n' && bytes.IndexByte(line[:n-2], '\r') < 0
}

// trimEOL removes a line's LF and one CR before it, as net/http's line
// reader does.
func trimEOL(line []byte) []byte {
	line = bytes.TrimSuffix(line, []byte{'\n'})
	return bytes.TrimSuffix(line, []byte{'\r'})
}

// asciiEqualFold reports whether b equals the lower-case ASCII s, ignoring
// ASCII case.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}
