package idem

import (
	"errors"
	"fmt"
	"strings"

	"github.com/dunglas/httpsfv"
	"github.com/idemhq/idem/canonjson"
)

// MaxKeyLength is the longest key, in bytes after unquoting, that ParseKey
// accepts.
const MaxKeyLength = 255

// Key parsing errors. ParseKey wraps one of them with detail; the middleware
// answers both with 400 and the matching problem code.
var (
	// ErrKeyMissing reports that a request carries no Idempotency-Key field.
	ErrKeyMissing = errors.New("idem: Idempotency-Key header is missing")

	// ErrKeyInvalid reports an Idempotency-Key field that is not exactly one
	// string of 1 to MaxKeyLength printable ASCII characters.
	ErrKeyInvalid = errors.New("idem: Idempotency-Key header is invalid")

	// ErrInvalidJSON reports a JSON request body that cannot be
	// canonicalised for its fingerprint (see canonjson.ErrInvalid): the
	// middleware answers 400 idempotency.body_invalid, and Fingerprint
	// returns an error wrapping it.
	ErrInvalidJSON = canonjson.ErrInvalid
)

// ParseKey returns the key named by the Idempotency-Key field values of one
// request (as returned by http.Header.Values).
//
// Two forms name the same key: the Structured Field string of RFC 9651
// ("abc", with \" and \\ as the only escapes; parameters are ignored) and the
// bare form (abc) that many clients send. After unquoting the key must be 1 to
// MaxKeyLength printable ASCII characters (0x20 to 0x7E).
//
// No values yields ErrKeyMissing. Two or more fields, a value that is a list
// (a comma outside a quoted string), an empty value, and any value that is
// over-long, non-ASCII or holds control characters yield an error wrapping
// ErrKeyInvalid.
func ParseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", ErrKeyMissing
	case 1:
	default:
		return "", fmt.Errorf("%w: %d Idempotency-Key fields, exactly one is allowed", ErrKeyInvalid, len(values))
	}
	v := trimSpaceTab(values[0])
	if v == "" {
		return "", fmt.Errorf("%w: the value is empty", ErrKeyInvalid)
	}
	if v[0] == '"' {
		return parseQuotedKey(v)
	}
	return parseBareKey(v)
}

// trimSpaceTab is strings.Trim(v, " \t") in one loop each way.
func trimSpaceTab(v string) string {
	i, j := 0, len(v)
	for i < j && (v[i] == ' ' || v[i] == '\t') {
		i++
	}
	for j > i && (v[j-1] == ' ' || v[j-1] == '\t') {
		j--
	}
	return v[i:j]
}

// parseQuotedKey handles the Structured Field form. The common case (no
// escapes, no parameters) is checked by hand so that a well-formed key costs
// no allocation beyond the returned string; everything else goes through
// httpsfv, which implements RFC 9651 in full.
func parseQuotedKey(v string) (string, error) {
	if len(v) >= 2 && v[len(v)-1] == '"' {
		inner := v[1 : len(v)-1]
		// One pass: a quote or backslash sends the value to httpsfv, and
		// without one any other byte outside printable ASCII is checkKey's
		// error, as is the length.
		plain, special := len(inner) <= MaxKeyLength, false
		for i := 0; i < len(inner); i++ {
			c := inner[i]
			if c == '"' || c == '\\' {
				special = true
				break
			}
			if c < 0x20 || c > 0x7e {
				plain = false
			}
		}
		if !special {
			if !plain || inner == "" {
				return "", checkKey(inner)
			}
			return inner, nil
		}
	}
	item, err := httpsfv.UnmarshalItem([]string{v})
	if err != nil {
		if strings.Contains(v, ",") {
			return "", fmt.Errorf("%w: a list of values is not allowed", ErrKeyInvalid)
		}
		return "", fmt.Errorf("%w: not a valid structured field string: %v", ErrKeyInvalid, err)
	}
	s, ok := item.Value.(string)
	if !ok {
		return "", fmt.Errorf("%w: the value is not a string", ErrKeyInvalid)
	}
	if err := checkKey(s); err != nil {
		return "", err
	}
	return s, nil
}

// parseBareKey handles the unquoted form. A comma means a list (or two
// fields an intermediary joined into one), and a double quote means broken
// quoting; both are rejected rather than guessed at.
func parseBareKey(v string) (string, error) {
	if strings.IndexByte(v, ',') >= 0 {
		return "", fmt.Errorf("%w: a list of values is not allowed", ErrKeyInvalid)
	}
	if strings.IndexByte(v, '"') >= 0 {
		return "", fmt.Errorf("%w: unbalanced quotes", ErrKeyInvalid)
	}
	if err := checkKey(v); err != nil {
		return "", err
	}
	return v, nil
}

func checkKey(k string) error {
	if k == "" {
		return fmt.Errorf("%w: the key is empty", ErrKeyInvalid)
	}
	if len(k) > MaxKeyLength {
		return fmt.Errorf("%w: the key is %d bytes long, the limit is %d", ErrKeyInvalid, len(k), MaxKeyLength)
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte %d is not printable ASCII", ErrKeyInvalid, i)
		}
	}
	return nil
}

// FormatKey returns key in the Structured Field string form ("abc") used in
// the Idempotency-Key response header. Keys accepted by ParseKey always
// format.
func FormatKey(key string) string {
	if !strings.ContainsAny(key, `"\`) {
		return `"` + key + `"`
	}
	var b strings.Builder
	b.Grow(len(key) + 4)
	b.WriteByte('"')
	for i := 0; i < len(key); i++ {
		if c := key[i]; c == '"' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(key[i])
	}
	b.WriteByte('"')
	return b.String()
}
