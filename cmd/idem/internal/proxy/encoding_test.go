package proxy

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/idemhq/idem"
)

// gzipped returns b gzip-compressed.
func gzipped(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// paymentJSON is the upstream's answer body: large enough that a gzip
// middleware would compress it.
var paymentJSON = []byte(`{"id":"pay_1","status":"succeeded","amount":100,"currency":"EUR","description":"` + strings.Repeat("x", 300) + `"}`)

// compressingUpstream answers paymentJSON, gzip-compressed when the
// request accepts gzip (as a compression middleware does) or always, and
// records the Accept-Encoding of each request.
func compressingUpstream(t *testing.T, always bool, extra func(h http.Header)) (*upstream, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var seen []string
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		ae := r.Header.Get("Accept-Encoding")
		mu.Lock()
		seen = append(seen, ae)
		mu.Unlock()
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Vary", "Accept-Encoding")
		h.Set("Etag", `"v1"`)
		if extra != nil {
			extra(h)
		}
		if always || strings.Contains(ae, "gzip") {
			h.Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusCreated)
			w.Write(gzipped(t, paymentJSON))
			return
		}
		w.WriteHeader(http.StatusCreated)
		w.Write(paymentJSON)
	})
	return up, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

// TestReplayIsReadableWhateverTheRetryAccepts: the first request accepts
// gzip and the retry does not, or the reverse; each gets a body it can
// read, and the replay is the stored bytes exactly.
func TestReplayIsReadableWhateverTheRetryAccepts(t *testing.T) {
	t.Parallel()
	up, seen := compressingUpstream(t, false, nil)
	px := newTestProxy(t, up, Config{})
	for _, order := range [][2]string{{"gzip, deflate, br", ""}, {"", "gzip"}, {"gzip", "identity"}} {
		key := newKey(t)
		first := send(t, http.MethodPost, px.URL+"/payments", `{"amount":100}`, idem.HeaderKey, key, "Accept-Encoding", order[0])
		retry := send(t, http.MethodPost, px.URL+"/payments", `{"amount":100}`, idem.HeaderKey, key, "Accept-Encoding", order[1])
		for i, r := range []reply{first, retry} {
			if r.status != http.StatusCreated || r.header.Get("Content-Encoding") != "" || r.body != string(paymentJSON) {
				t.Fatalf("%q then %q: response %d: %d, Content-Encoding %q, body %.40q", order[0], order[1], i, r.status, r.header.Get("Content-Encoding"), r.body)
			}
		}
		if retry.header.Get(idem.HeaderReplayed) != "true" || up.count(key) != 1 {
			t.Fatalf("%q then %q: the retry was not a replay (upstream ran %d)", order[0], order[1], up.count(key))
		}
		if retry.header.Get("Vary") != "Accept-Encoding" || retry.header.Get("Etag") != `"v1"` {
			t.Errorf("%q then %q: replay header %v", order[0], order[1], retry.header)
		}
	}
	for _, ae := range seen() {
		if ae != "identity" {
			t.Fatalf("a protected request reached the upstream with Accept-Encoding %q, want identity", ae)
		}
	}
	// Pass-through requests keep the client's Accept-Encoding and get the
	// upstream's coding.
	r := send(t, http.MethodGet, px.URL+"/payments/1", "", "Accept-Encoding", "gzip")
	if got := seen(); got[len(got)-1] != "gzip" || r.header.Get("Content-Encoding") != "gzip" || r.body != string(gzipped(t, paymentJSON)) {
		t.Fatalf("pass-through: upstream saw %q, client got Content-Encoding %q", got[len(got)-1], r.header.Get("Content-Encoding"))
	}
}

// TestUpstreamThatAlwaysGzipsIsDecoded: an upstream that compresses
// although the proxy asked for identity has its gzip undone before the
// response is stored: the first answer and every replay are the same
// readable bytes, and the fields about the coded bytes are gone.
func TestUpstreamThatAlwaysGzipsIsDecoded(t *testing.T) {
	t.Parallel()
	up, _ := compressingUpstream(t, true, func(h http.Header) {
		h.Set("Content-Digest", "sha-256=:coded:")
	})
	px := newTestProxy(t, up, Config{})
	key := newKey(t)
	first := send(t, http.MethodPost, px.URL+"/payments", `{}`, idem.HeaderKey, key, "Accept-Encoding", "gzip")
	for _, ae := range []string{"", "gzip"} {
		retry := send(t, http.MethodPost, px.URL+"/payments", `{}`, idem.HeaderKey, key, "Accept-Encoding", ae)
		for _, r := range []reply{first, retry} {
			if r.status != http.StatusCreated || r.body != string(paymentJSON) || r.header.Get("Content-Encoding") != "" || r.header.Get("Content-Digest") != "" {
				t.Fatalf("%d %v %.40q", r.status, r.header, r.body)
			}
			if r.header.Get("Content-Length") != fmt.Sprint(len(paymentJSON)) {
				t.Errorf("Content-Length %q, want the decoded length %d", r.header.Get("Content-Length"), len(paymentJSON))
			}
			if r.header.Get("Etag") != `W/"v1"` {
				t.Errorf("ETag %q, want the weak W/\"v1\"", r.header.Get("Etag"))
			}
		}
		if retry.header.Get(idem.HeaderReplayed) != "true" || up.count(key) != 1 {
			t.Fatalf("not a replay: %v (upstream ran %d)", retry, up.count(key))
		}
	}
}

// TestUndecodableCodingIsStoredAsItCame: a coding the proxy cannot undo,
// or may not (no-transform), is stored and replayed as the upstream sent
// it, and logged once.
func TestUndecodableCodingIsStoredAsItCame(t *testing.T) {
	t.Parallel()
	for name, extra := range map[string]func(h http.Header){
		"no-transform": func(h http.Header) { h.Set("Cache-Control", "private, no-transform") },
		"br":           nil,
	} {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			h := w.Header()
			h.Set("Content-Type", "application/json")
			if extra != nil {
				extra(h)
				h.Set("Content-Encoding", "gzip")
				w.WriteHeader(http.StatusCreated)
				w.Write(gzipped(t, paymentJSON))
				return
			}
			h.Set("Content-Encoding", "br")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte("not really brotli"))
		})
		var logs bytes.Buffer
		var mu sync.Mutex
		logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
		px := newTestProxy(t, up, Config{Logger: logger})
		key := newKey(t)
		first := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key)
		again := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key)
		send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, newKey(t))
		if first.body != again.body || again.header.Get("Content-Encoding") != first.header.Get("Content-Encoding") ||
			first.header.Get("Content-Encoding") == "" || again.header.Get(idem.HeaderReplayed) != "true" {
			t.Fatalf("%s: first %v\nagain %v", name, first, again)
		}
		mu.Lock()
		n := strings.Count(logs.String(), "cannot undo it")
		mu.Unlock()
		if n != 1 {
			t.Errorf("%s: %d warnings, want one:\n%s", name, n, logs.String())
		}
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestCorruptGzipIsReleased: a gzip-coded answer that does not decode is
// an invalid answer: 502, the key released, the retry runs again.
func TestCorruptGzipIsReleased(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			w.Header().Set("Content-Encoding", "gzip")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte("this is not gzip at all"))
			return
		}
		writeJSON(w, http.StatusCreated, map[string]int{"n": n})
	})
	px := newTestProxy(t, up, Config{})
	key := newKey(t)
	r := send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key)
	if r.status != http.StatusBadGateway || r.problemCode() != CodeUpstreamFailed {
		t.Fatalf("corrupt gzip: %v", r)
	}
	r = send(t, http.MethodPost, px.URL+"/p", `{}`, idem.HeaderKey, key)
	if r.status != http.StatusCreated || r.header.Get(idem.HeaderReplayed) != "false" || up.count(key) != 2 {
		t.Fatalf("retry: %v (upstream ran %d)", r, up.count(key))
	}
}

// TestProtectedChunkedBodyGoesWithContentLength: a protected body the
// client sent chunked, empty or not, reaches the upstream with a
// Content-Length and without Transfer-Encoding (on the wire).
func TestProtectedChunkedBodyGoesWithContentLength(t *testing.T) {
	t.Parallel()
	up := newRecordingUpstream(t)
	u, _ := url.Parse(up.url)
	px := newTestProxy(t, nil, Config{Upstream: u})
	addr := strings.TrimPrefix(px.URL, "http://")
	for _, c := range []struct{ method, chunks, body, length string }{
		{"POST", "0\r\n\r\n", "", "0"},
		{"PATCH", "0\r\n\r\n", "", "0"},
		{"POST", "4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n", `{"a":1}`, "7"},
	} {
		_, before := up.received()
		replies, _ := rawExchange(t, addr, c.method+" /p HTTP/1.1\r\nHost: x\r\nAuthorization: "+testCredential+
			"\r\nIdempotency-Key: "+newKey(t)+"\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"+c.chunks)
		if len(replies) != 1 || replies[0].status != http.StatusCreated {
			t.Fatalf("%s %q: %+v", c.method, c.body, replies)
		}
		var answer struct{ Body string }
		if err := json.Unmarshal([]byte(replies[0].body), &answer); err != nil || answer.Body != c.body {
			t.Fatalf("%s: the upstream read the body %q (%v), want %q", c.method, answer.Body, err, c.body)
		}
		_, after := up.received()
		wire := strings.ToLower(after[len(before):])
		if !strings.Contains(wire, "\r\ncontent-length: "+c.length+"\r\n") || strings.Contains(wire, "transfer-encoding") {
			t.Fatalf("%s %q went upstream as:\n%s", c.method, c.body, wire)
		}
	}
}
