package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"mime"
	"strings"

	"github.com/idemhq/idem/canonjson"
)

// FingerprintVersion names the request encoding that Fingerprint hashes. It
// is the prefix of every fingerprint ("v1:…") and so is stored with every
// record: when a later release changes the encoding, records written with an
// older version are still compared in their own version, and retries of
// requests made before an upgrade replay instead of failing with 422.
const FingerprintVersion = "v1"

// FingerprintInput is what a fingerprint covers.
type FingerprintInput struct {
	// Method is the HTTP method, or any verb naming the action for non-HTTP
	// callers.
	Method string
	// Operation names the operation, typically the route pattern.
	Operation string
	// Target is the request target (path and query, as in the request
	// line). It distinguishes requests to one route pattern that differ in
	// a path parameter or query: POST /orders/1/refund and POST
	// /orders/2/refund are different requests for one operation.
	Target string
	// ContentType is the request's Content-Type field value, if any.
	ContentType string
	// Body is the request body, or the payload chosen by an application
	// hook when Payload is set.
	Body []byte
	// Payload marks Body as an application-normalised payload, hashed as
	// given instead of being canonicalised.
	Payload bool
}

// Fingerprint returns the versioned SHA-256 fingerprint of a request, in the
// form "v1:" followed by 64 lower-case hex digits.
//
// Version 1 hashes the byte string
//
//	"idem-fingerprint-v1\n" field(Method) field(Operation) field(Target)
//	field(media type) field(body kind) field(body)
//
// where field(x) is x's length as an unsigned LEB128 varint followed by x.
// The media type is the Content-Type with its type and parameter names in
// lower case, parameters sorted, the charset value in lower case, and a
// charset of utf-8 dropped for JSON (JSON is always UTF-8). The body kind is
// "json" when the media type is application/json or ends in +json and the
// body is not empty (the body is then replaced by its canonjson.Append
// form), "payload" for application-normalised payloads, and "bytes" for
// everything else, which is hashed as sent.
//
// A JSON body that cannot be canonicalised yields an error wrapping
// ErrInvalidJSON.
func Fingerprint(in FingerprintInput) (string, error) {
	bp := fpBufPool.Get()
	defer fpBufPool.Put(bp)
	buf := append((*bp)[:0], "idem-fingerprint-v1\n"...)
	buf = appendField(buf, in.Method)
	buf = appendField(buf, in.Operation)
	buf = appendField(buf, in.Target)
	mt, isJSON := normaliseMediaType(in.ContentType)
	buf = appendField(buf, mt)
	switch {
	case in.Payload:
		buf = appendField(buf, "payload")
		buf = appendField(buf, in.Body)
	case isJSON && len(in.Body) > 0:
		buf = appendField(buf, "json")
		// Reserve room for the length prefix after the canonical body is
		// known: write the body first, then the prefix, then rotate.
		start := len(buf)
		var err error
		buf, err = canonjson.Append(buf, in.Body)
		if err != nil {
			*bp = buf[:0]
			return "", err
		}
		n := len(buf) - start
		var pre [binary.MaxVarintLen64]byte
		pl := binary.PutUvarint(pre[:], uint64(n))
		buf = append(buf, pre[:pl]...)
		copy(buf[start+pl:], buf[start:start+n])
		copy(buf[start:], pre[:pl])
	default:
		buf = appendField(buf, "bytes")
		buf = appendField(buf, in.Body)
	}
	sum := sha256.Sum256(buf)
	if cap(buf) <= 64<<10 {
		*bp = buf[:0]
	}
	var out [len(FingerprintVersion) + 1 + 2*sha256.Size]byte
	n := copy(out[:], FingerprintVersion+":")
	for i, c := range sum {
		copy(out[n+2*i:n+2*i+2], hexPairs[2*int(c):2*int(c)+2])
	}
	return string(out[:]), nil
}

// hexPairs holds the two lower-case hex digits of every byte value, at
// twice the value: encoding a digest takes one copy per byte instead of
// hex.Encode's two look-ups and shifts.
const hexPairs = "" +
	"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f" +
	"202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f" +
	"404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f" +
	"606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f" +
	"808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f" +
	"a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf" +
	"c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf" +
	"e0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff"

var fpBufPool = pool(func() *[]byte { b := make([]byte, 0, 1024); return &b })

func appendField[T string | []byte](buf []byte, v T) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(v)))
	return append(buf, v...)
}

// fingerprintVersionOf returns the version prefix of a stored fingerprint.
func fingerprintVersionOf(fp string) string {
	v, _, _ := strings.Cut(fp, ":")
	return v
}

// normaliseMediaType returns the canonical spelling of a Content-Type value
// and whether it names JSON.
func normaliseMediaType(ct string) (string, bool) {
	if ct == "" {
		return "", false
	}
	// Fast path for the overwhelmingly common spellings.
	switch ct {
	case "application/json", "application/json; charset=utf-8", "application/json; charset=UTF-8":
		return "application/json", true
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		// Unparseable: hash it as sent (trimmed), never as JSON.
		return strings.TrimSpace(ct), false
	}
	isJSON := mt == "application/json" || strings.HasSuffix(mt, "+json")
	if cs, ok := params["charset"]; ok {
		cs = strings.ToLower(cs)
		if isJSON && cs == "utf-8" {
			delete(params, "charset")
		} else {
			params["charset"] = cs
		}
	}
	if len(params) == 0 {
		return mt, isJSON
	}
	return mime.FormatMediaType(mt, params), isJSON
}
