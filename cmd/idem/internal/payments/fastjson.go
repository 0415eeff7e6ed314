package payments

import (
	"bytes"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// fastRequest is a valid request as parseFast found it, normalised: ref is
// in the body, or in parseFast's scratch buffer when it had escapes.
type fastRequest struct {
	amount   int64
	currency [3]byte
	ref      []byte
}

// parseFast is the fast path of Validate and Fingerprint. It handles a
// valid request spelt the usual way: a flat object of exactly the three
// fields, in any order, the amount in plain digits (not 2599.0 or
// 2.599e3), the strings with or without escapes. It reports ok only for a
// body validateStrict accepts, and returns then the same normalised
// values; everything else, including every invalid request (whose problem
// is the strict parser's to word), it leaves to validateStrict. It
// allocates nothing unless scratch, which receives strings with escapes,
// must grow.
func parseFast(body, scratch []byte) (f fastRequest, ok bool) {
	// The canonicaliser's rules, for the subset of JSON accepted here:
	// valid UTF-8 (checked for the whole body, as it does), JSON
	// whitespace, strings as fastString reads them, no duplicate member
	// names, nothing after the object.
	if !utf8.Valid(body) {
		return f, false
	}
	var currency, ref []byte
	var seen uint8
	i := skipJSONSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return f, false
	}
	for {
		i = skipJSONSpace(body, i+1) // after '{' or ','
		var name []byte
		if name, scratch, i, ok = fastString(body, i, scratch); !ok {
			return f, false
		}
		i = skipJSONSpace(body, i)
		if i == len(body) || body[i] != ':' {
			return f, false
		}
		i = skipJSONSpace(body, i+1)
		var bit uint8
		switch string(name) { // the decoded name, as the strict parser compares them
		case "amountCents":
			bit = 1
			f.amount, i, ok = fastAmount(body, i)
		case "currency":
			bit = 2
			currency, scratch, i, ok = fastString(body, i, scratch)
		case "reference":
			bit = 4
			ref, scratch, i, ok = fastString(body, i, scratch)
		}
		if bit == 0 || seen&bit != 0 || !ok {
			return f, false // an unknown or duplicate member, or a value to refuse
		}
		seen |= bit
		i = skipJSONSpace(body, i)
		if i == len(body) {
			return f, false
		}
		if body[i] == '}' {
			break
		}
		if body[i] != ',' {
			return f, false
		}
	}
	if seen != 7 || skipJSONSpace(body, i+1) != len(body) {
		return f, false
	}

	// The checks of validateStrict. strings.ToUpper(strings.TrimSpace(c))
	// is three ASCII letters when the trimmed c is; it can also be when c
	// is not ASCII (ToUpper maps ı to I and ſ to S): that case goes the
	// strict way.
	currency = bytes.TrimSpace(currency) // as strings.TrimSpace
	if len(currency) != len(f.currency) {
		return f, false
	}
	for k, c := range currency {
		switch {
		case 'a' <= c && c <= 'z':
			c -= 'a' - 'A'
		case 'A' <= c && c <= 'Z':
		default:
			return f, false
		}
		f.currency[k] = c
	}
	if !knownCurrency(string(f.currency[:])) {
		return f, false // refused by validateStrict
	}
	ref = bytes.TrimSpace(ref)
	if len(ref) == 0 || utf8.RuneCount(ref) > 100 || bytes.ContainsFunc(ref, unicode.IsControl) {
		return f, false
	}
	f.ref = ref
	return f, true
}

// skipJSONSpace returns the index of the first byte at or after i that is
// not JSON whitespace.
func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// fastAmount reads at body[i] an amount spelt in plain digits that is
// valid: 1 to 1000000000000000. It returns the index after the digits; a
// fraction or an exponent that follows them is not JSON parseFast accepts.
func fastAmount(body []byte, i int) (int64, int, bool) {
	start := i
	var v int64
	for i < len(body) && '0' <= body[i] && body[i] <= '9' {
		if i-start == 16 { // more digits than 1000000000000000
			return 0, i, false
		}
		v = v*10 + int64(body[i]-'0')
		i++
	}
	// No digits, a leading zero (JSON allows none but 0 itself, which is
	// not a valid amount either), or too large.
	if i == start || body[start] == '0' || v > 1e15 {
		return 0, i, false
	}
	return v, i, true
}

// fastString reads the JSON string at body[i] by the canonicaliser's rules:
// no raw control characters, the escapes of JSON, and surrogates escaped
// only in pairs. It returns the string's contents, a part of body or,
// when it has escapes, decoded onto the end of scratch, with scratch and
// the index after the closing quote.
func fastString(body []byte, i int, scratch []byte) (s, scratchOut []byte, next int, ok bool) {
	if i == len(body) || body[i] != '"' {
		return nil, scratch, i, false
	}
	i++
	from := -1 // where s starts in scratch, once there was an escape
	for {
		run := i
		for i < len(body) && body[i] != '"' && body[i] != '\\' && body[i] >= 0x20 {
			i++
		}
		if i == len(body) || body[i] < 0x20 {
			return nil, scratch, i, false
		}
		if body[i] == '"' {
			if from < 0 {
				return body[run:i], scratch, i + 1, true
			}
			scratch = append(scratch, body[run:i]...)
			return scratch[from:], scratch, i + 1, true
		}
		// An escape.
		if from < 0 {
			from = len(scratch)
		}
		scratch = append(scratch, body[run:i]...)
		if i+1 == len(body) {
			return nil, scratch, i, false
		}
		var r rune
		switch e := body[i+1]; e {
		case '"', '\\', '/':
			r = rune(e)
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			u, ok := hex4(body, i+2)
			if !ok {
				return nil, scratch, i, false
			}
			i += 4
			r = rune(u)
			if utf16.IsSurrogate(r) {
				// A high surrogate must be followed by an escaped
				// low one; anything else is refused.
				lo, ok := rune(0), false
				if r < 0xdc00 && i+3 < len(body) && body[i+2] == '\\' && body[i+3] == 'u' {
					var v uint16
					if v, ok = hex4(body, i+4); ok {
						lo = rune(v)
					}
				}
				if r = utf16.DecodeRune(r, lo); r == utf8.RuneError {
					return nil, scratch, i, false
				}
				i += 6
			}
		default:
			return nil, scratch, i, false
		}
		i += 2
		scratch = utf8.AppendRune(scratch, r)
	}
}

// hex4 returns the value of the four hexadecimal digits at b[at], as a
// \u escape spells them.
func hex4(b []byte, at int) (uint16, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[at:at+4]), 16, 16)
	return uint16(v), err == nil
}

// appendFingerprint appends the JSON of the normalised request, byte for
// byte as json.Marshal writes a normalised: it is hashed into the stored
// fingerprints, so that any difference would refuse every retry of a
// request stored before it.
func appendFingerprint(dst []byte, amount int64, currency, reference []byte) []byte {
	dst = append(dst, `{"amountCents":`...)
	dst = strconv.AppendInt(dst, amount, 10)
	dst = append(dst, `,"currency":`...)
	dst = appendJSONString(dst, currency)
	dst = append(dst, `,"reference":`...)
	dst = appendJSONString(dst, reference)
	return append(dst, '}')
}

// appendJSONString appends s as a JSON string exactly as encoding/json
// writes one: \" \\ \b \f \n \r \t, \u00xx for the other control
// characters, the HTML-safe \u003c \u003e \u0026 for < > &, \u2028 and
// \u2029, and \ufffd for each byte of invalid UTF-8.
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRune(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[c&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
