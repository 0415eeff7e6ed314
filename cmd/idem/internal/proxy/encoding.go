package proxy

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
)

// Content coding of protected responses.
//
// A stored response is replayed to every retry of its key, whatever the
// retry's Accept-Encoding says (the core replays byte for byte and does
// not renegotiate). A body stored gzip-compressed because the first
// request accepted gzip is unreadable to a retry that does not. The proxy
// therefore asks the upstream for identity on every protected request
// (see rewrite), so that the stored body is one any retry reads; the
// first client gets it uncompressed too. An upstream that compresses
// anyway is undone here when it used gzip, the one coding nearly every
// server uses, before the response is stored and sent.

// decodeContent removes a gzip content coding the upstream applied to
// the response to a protected request although the proxy asked for
// identity. The body becomes the decoded one and the header fields that
// describe the coded bytes go: Content-Length (unknown until decoded),
// the digests of the coded content, and a strong ETag (made weak: the
// representation is equivalent, not the same bytes). A coding the proxy
// cannot undo (br, zstd, deflate, several codings) or may not (the
// upstream said Cache-Control: no-transform) is stored and replayed as it
// came, with a warning logged once. A gzip header that does not parse is
// an invalid answer (502 proxy.upstream_failed, the key released); a
// body that breaks off while decoding ends the response as any broken
// upstream body does.
func (p *Proxy) decodeContent(res *http.Response) error {
	codings := listTokens(res.Header.Values("Content-Encoding"))
	if len(codings) == 0 || len(codings) == 1 && codings[0] == "identity" {
		return nil
	}
	if res.Body == nil || res.Body == http.NoBody || res.ContentLength == 0 || res.Request.Method == http.MethodHead ||
		res.StatusCode == http.StatusNoContent || res.StatusCode == http.StatusNotModified {
		return nil // no body to decode
	}
	gzipped := len(codings) == 1 && (codings[0] == "gzip" || codings[0] == "x-gzip")
	noTransform := slices.Contains(listTokens(res.Header.Values("Cache-Control")), "no-transform")
	if !gzipped || noTransform || res.StatusCode == http.StatusPartialContent {
		p.storedCoding.Do(func() {
			p.logger.Warn("the upstream answered a protected request with a content coding although the proxy asked for identity, and the proxy cannot undo it: the response is stored and replayed as it came, so a retry that does not accept the coding cannot read it",
				"content_encoding", strings.Join(codings, ", "), "no_transform", noTransform, "status", res.StatusCode,
				"method", res.Request.Method, "path", res.Request.URL.Path)
		})
		return nil
	}
	zr, err := gzip.NewReader(res.Body)
	if err != nil {
		return fmt.Errorf("proxy: the upstream's gzip-coded response does not decode: %w", err)
	}
	res.Body = &decodedBody{Reader: zr, coded: res.Body}
	res.ContentLength = -1
	h := res.Header
	for _, k := range []string{"Content-Encoding", "Content-Length", "Content-Md5", "Digest", "Content-Digest", "Repr-Digest"} {
		delete(h, k)
	}
	if etag := h.Get("Etag"); etag != "" && !strings.HasPrefix(etag, "W/") {
		h.Set("Etag", "W/"+etag)
	}
	return nil
}

// decodedBody is a decoded response body; closing it closes the coded one.
type decodedBody struct {
	*gzip.Reader
	coded io.Closer
}

func (b *decodedBody) Close() error {
	zerr := b.Reader.Close()
	if err := b.coded.Close(); err != nil {
		return err
	}
	return zerr
}

// listTokens splits comma-separated field values into lower-case tokens,
// without parameters.
func listTokens(values []string) []string {
	var tokens []string
	for _, v := range values {
		for _, t := range strings.Split(v, ",") {
			t, _, _ = strings.Cut(t, ";")
			if t = strings.ToLower(strings.TrimSpace(t)); t != "" {
				tokens = append(tokens, t)
			}
		}
	}
	return tokens
}
