// Package canonjson writes JSON in a canonical form, so that two texts of the
// same value compare equal byte for byte (RFC 8785, with exact numbers; see
// Append), and reads RFC 6901 JSON Pointers (ParsePointer). idem
// fingerprints JSON request bodies with it; it has no other dependency than
// the standard library.
package canonjson

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// ErrInvalid reports a body that claims to be JSON but cannot be
// canonicalised: malformed JSON, invalid UTF-8, an escaped lone surrogate, a
// duplicate member name, or nesting deeper than maxJSONDepth. The
// middleware answers it with 400 idempotency.body_invalid before any key is
// claimed.
var ErrInvalid = errors.New("canonjson: invalid JSON")

// maxJSONDepth bounds nesting so that a hostile body cannot make the
// canonicaliser recurse without limit.
const maxJSONDepth = 512

// Append appends the canonical form of the JSON text src to dst.
//
// The form is RFC 8785 (JSON Canonicalization Scheme): no insignificant
// whitespace, object members sorted by the UTF-16 code units of their names,
// strings with the minimal escapes. It differs from RFC 8785 in one
// deliberate way: numbers keep their exact decimal value instead of being
// rounded to IEEE 754 doubles. A number is written with the ECMAScript
// Number-to-String layout applied to its exact significant digits, so 1, 1.0,
// 10e-1 and 0.1e1 all become 1, while 9007199254740993 and 9007199254740992
// (equal as doubles) stay different. For every number a double represents
// exactly with its shortest digits the output equals RFC 8785's. Negative
// zero is written as 0.
//
// Errors wrap ErrInvalid.
func Append(dst, src []byte) ([]byte, error) {
	c := canonPool.Get().(*canonicalizer)
	c.src, c.pos, c.dst = src, 0, dst
	err := c.run()
	out := c.dst
	c.reset()
	canonPool.Put(c)
	if err != nil {
		return dst, err
	}
	return out, nil
}

var canonPool = sync.Pool{New: func() any { return new(canonicalizer) }}

// member locates one object member while its object is being sorted: its
// decoded name and its serialised "name":value in dst. A name without
// escapes is its own decoded form, so it is read where it stands in src;
// only a name with an escape is decoded, into keys.
type member struct {
	keyStart, keyEnd int  // the name in src, or in keys if decoded is set
	decoded          bool // the name had an escape
	outStart, outEnd int
}

type canonicalizer struct {
	src     []byte
	pos     int
	dst     []byte
	keys    []byte   // decoded member names (those with escapes) of the open objects
	members []member // members of the open objects, innermost last
	scratch []byte   // reordering buffer
}

func (c *canonicalizer) reset() {
	c.src, c.dst = nil, nil
	c.keys, c.members, c.scratch = c.keys[:0], c.members[:0], c.scratch[:0]
	if cap(c.scratch) > 64<<10 { // do not pin huge buffers in the pool
		c.scratch = nil
	}
	if cap(c.keys) > 64<<10 {
		c.keys = nil
	}
}

func (c *canonicalizer) run() error {
	if !utf8.Valid(c.src) {
		return fmt.Errorf("%w: not valid UTF-8", ErrInvalid)
	}
	c.skipSpace()
	if err := c.value(0); err != nil {
		return err
	}
	c.skipSpace()
	if c.pos != len(c.src) {
		return c.errorf("unexpected data after the top-level value")
	}
	return nil
}

func (c *canonicalizer) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: offset %d: %s", ErrInvalid, c.pos, fmt.Sprintf(format, args...))
}

func (c *canonicalizer) skipSpace() {
	src, pos := c.src, c.pos
	// No byte above ' ' is space; most calls find none at all.
	for pos < len(src) && src[pos] <= ' ' {
		switch src[pos] {
		case ' ', '\t', '\n', '\r':
			pos++
			continue
		}
		break
	}
	c.pos = pos
}

func (c *canonicalizer) value(depth int) error {
	if c.pos >= len(c.src) {
		return c.errorf("unexpected end of input")
	}
	switch ch := c.src[c.pos]; {
	case ch == '{':
		return c.object(depth + 1)
	case ch == '[':
		return c.array(depth + 1)
	case ch == '"':
		_, err := c.str(false)
		return err
	case ch == '-' || (ch >= '0' && ch <= '9'):
		return c.number()
	default:
		for _, lit := range [...]string{"true", "false", "null"} {
			if len(c.src)-c.pos >= len(lit) && string(c.src[c.pos:c.pos+len(lit)]) == lit {
				c.dst = append(c.dst, lit...)
				c.pos += len(lit)
				return nil
			}
		}
		return c.errorf("unexpected character %q", ch)
	}
}

func (c *canonicalizer) array(depth int) error {
	if depth > maxJSONDepth {
		return c.errorf("nesting deeper than %d", maxJSONDepth)
	}
	c.pos++ // [
	c.dst = append(c.dst, '[')
	c.skipSpace()
	if c.pos < len(c.src) && c.src[c.pos] == ']' {
		c.pos++
		c.dst = append(c.dst, ']')
		return nil
	}
	for {
		c.skipSpace()
		if err := c.value(depth); err != nil {
			return err
		}
		c.skipSpace()
		if c.pos >= len(c.src) {
			return c.errorf("unterminated array")
		}
		switch c.src[c.pos] {
		case ',':
			c.pos++
			c.dst = append(c.dst, ',')
		case ']':
			c.pos++
			c.dst = append(c.dst, ']')
			return nil
		default:
			return c.errorf("expected ',' or ']' in array")
		}
	}
}

func (c *canonicalizer) object(depth int) error {
	if depth > maxJSONDepth {
		return c.errorf("nesting deeper than %d", maxJSONDepth)
	}
	c.pos++ // {
	c.dst = append(c.dst, '{')
	base, keyBase := len(c.members), len(c.keys)
	defer func() { c.members, c.keys = c.members[:base], c.keys[:keyBase] }()

	c.skipSpace()
	if c.pos < len(c.src) && c.src[c.pos] == '}' {
		c.pos++
		c.dst = append(c.dst, '}')
		return nil
	}
	for {
		c.skipSpace()
		if c.pos >= len(c.src) || c.src[c.pos] != '"' {
			return c.errorf("expected a member name")
		}
		m := member{outStart: len(c.dst), keyStart: c.pos + 1}
		decoded := len(c.keys)
		escaped, err := c.str(true)
		if err != nil {
			return err
		}
		if escaped {
			m.keyStart, m.keyEnd, m.decoded = decoded, len(c.keys), true
		} else {
			m.keyEnd = c.pos - 1 // before the closing quote
		}
		c.skipSpace()
		if c.pos >= len(c.src) || c.src[c.pos] != ':' {
			return c.errorf("expected ':' after a member name")
		}
		c.pos++
		c.dst = append(c.dst, ':')
		c.skipSpace()
		if err := c.value(depth); err != nil {
			return err
		}
		m.outEnd = len(c.dst)
		c.members = append(c.members, m)
		c.skipSpace()
		if c.pos >= len(c.src) {
			return c.errorf("unterminated object")
		}
		if c.src[c.pos] == '}' {
			c.pos++
			break
		}
		if c.src[c.pos] != ',' {
			return c.errorf("expected ',' or '}' in object")
		}
		c.pos++
		c.dst = append(c.dst, ',')
	}
	return c.sortMembers(c.members[base:])
}

// name returns the decoded name of m.
func (c *canonicalizer) name(m *member) []byte {
	if m.decoded {
		return c.keys[m.keyStart:m.keyEnd]
	}
	return c.src[m.keyStart:m.keyEnd]
}

// smallObject is the most members an object may have to be sorted by
// insertion. On members already in order insertion sort makes one pass of
// n-1 comparisons, like the check the general path starts with; on a
// handful of members out of order it beats slices.SortFunc; and it finds
// duplicates as it goes, where the general path needs a pass of its own.
const smallObject = 12

// sortMembers puts the members of the object just written into RFC 8785
// order and rejects duplicate names.
func (c *canonicalizer) sortMembers(ms []member) error {
	// The members that move are those from lo to hi; the ones before lo
	// and after hi stay where they were written.
	start, end := ms[0].outStart, len(c.dst)
	lo, hi := len(ms), -1
	if len(ms) <= smallObject {
		// Insertion sort: the members before i are in order and have
		// distinct names; member i moves down past those with greater
		// names. Since those are in increasing order, a member with the
		// same name as member i is met before any with a smaller one, so
		// every duplicate is found.
		for i := 1; i < len(ms); i++ {
			m := ms[i]
			key := c.name(&m)
			j := i
			for ; j > 0; j-- {
				d := compareUTF16(c.name(&ms[j-1]), key)
				if d == 0 {
					return fmt.Errorf("%w: duplicate member name %q", ErrInvalid, key)
				}
				if d < 0 {
					break
				}
				ms[j] = ms[j-1]
			}
			if j != i {
				ms[j] = m
				lo, hi = min(lo, j), i
			}
		}
	} else {
		for i := 1; i < len(ms); i++ {
			if compareUTF16(c.name(&ms[i-1]), c.name(&ms[i])) >= 0 {
				lo, hi = 0, len(ms)-1
				break
			}
		}
		if lo <= hi {
			slices.SortFunc(ms, func(a, b member) int { return compareUTF16(c.name(&a), c.name(&b)) })
			for i := 1; i < len(ms); i++ {
				if compareUTF16(c.name(&ms[i-1]), c.name(&ms[i])) == 0 {
					return fmt.Errorf("%w: duplicate member name %q", ErrInvalid, c.name(&ms[i]))
				}
			}
		}
	}
	if lo <= hi {
		// Members lo to hi are now those that were written there, in
		// another order, so they fill the same bytes: from after the
		// comma that ends member lo-1 to before the one that starts
		// member hi+1. Write them again in place.
		from, to := start, end
		if lo > 0 {
			from = ms[lo-1].outEnd + 1
		}
		if hi < len(ms)-1 {
			to = ms[hi+1].outStart - 1
		}
		c.scratch = append(c.scratch[:0], c.dst[from:to]...)
		n := from
		for i, m := range ms[lo : hi+1] {
			if i > 0 {
				c.dst[n] = ','
				n++
			}
			n += copy(c.dst[n:], c.scratch[m.outStart-from:m.outEnd-from])
		}
	}
	c.dst = append(c.dst, '}')
	return nil
}

// compareUTF16 orders two UTF-8 strings by their UTF-16 code units, as
// RFC 8785 requires. Both must be valid UTF-8, as member names are: src has
// passed utf8.Valid, and decoded names are written with utf8.AppendRune.
//
// UTF-8 byte order is code point order. UTF-16 order is code point order too,
// except that a character above U+FFFF, written as a surrogate pair whose
// first unit is in D800-DBFF, comes before one in U+E000-U+FFFF. So the
// strings are compared byte by byte, and only the first byte where they
// differ needs a closer look. The bytes before it are the same in both
// strings, so either both differing bytes start a character or both are
// continuation bytes of characters that began with the same bytes:
//
//   - Continuation bytes: the two characters have the same lead byte, so
//     the same length, and are either both in the BMP (lead below 0xF0; as
//     valid UTF-8 holds no surrogates, each is its own UTF-16 unit) or both
//     above U+FFFF (lead 0xF0-0xF4; surrogate pairs keep code point order).
//     Either way UTF-16 order is code point order is byte order.
//   - Lead bytes (or ASCII): they differ, so do the characters, and byte
//     order is code point order. UTF-16 disagrees only for a lead byte from
//     0xF0 up (above U+FFFF) against 0xEE or 0xEF (U+E000-U+FFFF); 0xED
//     (U+D000-U+D7FF) is below the surrogates in UTF-16 as in UTF-8.
func compareUTF16(a, b []byte) int {
	n := min(len(a), len(b))
	for i, x := range a[:n] {
		y := b[i]
		if x == y {
			continue
		}
		switch {
		case x >= 0xf0 && (y == 0xee || y == 0xef):
			return -1
		case y >= 0xf0 && (x == 0xee || x == 0xef):
			return 1
		}
		return int(x) - int(y)
	}
	return len(a) - len(b)
}

// endsPlainRun marks the bytes that end a run of string characters that can
// be copied as they are: the closing quote, a backslash, and the control
// characters, which JSON does not allow unescaped.
var endsPlainRun = func() (t [256]bool) {
	for ch := range 0x20 {
		t[ch] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// str reads a JSON string at c.pos and writes its canonical form to c.dst.
// It reports whether the string had an escape; if it had one and decode is
// set, it also appends the decoded string to c.keys. (Without an escape the
// decoded string is the text between the quotes.)
func (c *canonicalizer) str(decode bool) (escaped bool, err error) {
	// src, pos and dst are kept in locals, and stored back in c before
	// returning, so that the loops below do not write c.pos to memory for
	// every byte.
	src, pos := c.src, c.pos+1 // after the opening quote
	dst := append(c.dst, '"')
	for {
		// Copy the run of characters that need no escaping in one step.
		start := pos
		for pos < len(src) && !endsPlainRun[src[pos]] {
			pos++
		}
		dst = append(dst, src[start:pos]...)
		if decode && escaped {
			c.keys = append(c.keys, src[start:pos]...)
		}
		c.pos, c.dst = pos, dst
		if pos >= len(src) {
			return escaped, c.errorf("unterminated string")
		}
		ch := src[pos]
		switch {
		case ch == '"':
			c.pos++
			c.dst = append(dst, '"')
			return escaped, nil
		case ch < 0x20:
			return escaped, c.errorf("unescaped control character in string")
		}
		// An escape sequence. At the first one, the decoded string so far
		// is the run just copied.
		if decode && !escaped {
			c.keys = append(c.keys, src[start:pos]...)
		}
		escaped = true
		if pos+1 >= len(src) {
			return escaped, c.errorf("unterminated escape")
		}
		var r rune
		switch e := src[pos+1]; e {
		case '"', '\\', '/':
			r = rune(e)
			pos += 2
		case 'b':
			r, pos = '\b', pos+2
		case 'f':
			r, pos = '\f', pos+2
		case 'n':
			r, pos = '\n', pos+2
		case 'r':
			r, pos = '\r', pos+2
		case 't':
			r, pos = '\t', pos+2
		case 'u':
			u, ok := c.hex4(pos + 2)
			if !ok {
				return escaped, c.errorf("bad \\u escape")
			}
			pos += 6
			r = rune(u)
			if utf16.IsSurrogate(r) {
				lo, ok := rune(0), false
				if r < 0xdc00 && pos+1 < len(src) && src[pos] == '\\' && src[pos+1] == 'u' {
					var v uint16
					if v, ok = c.hex4(pos + 2); ok {
						lo = rune(v)
					}
				}
				if r = utf16.DecodeRune(r, lo); r == utf8.RuneError {
					c.pos = pos
					return escaped, c.errorf("escaped lone surrogate")
				}
				pos += 6
			}
		default:
			return escaped, c.errorf("bad escape \\%c", e)
		}
		dst = appendCanonicalRune(dst, r)
		if decode {
			c.keys = utf8.AppendRune(c.keys, r)
		}
	}
}

func (c *canonicalizer) hex4(at int) (uint16, bool) {
	if at+4 > len(c.src) {
		return 0, false
	}
	var v uint16
	for _, h := range c.src[at : at+4] {
		switch {
		case h >= '0' && h <= '9':
			h -= '0'
		case h >= 'a' && h <= 'f':
			h -= 'a' - 10
		case h >= 'A' && h <= 'F':
			h -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | uint16(h)
	}
	return v, true
}

// appendCanonicalRune writes r as RFC 8785 requires inside a string: the
// two-character escapes where JSON has one, \u00xx for other control
// characters, and the character itself otherwise.
func appendCanonicalRune(dst []byte, r rune) []byte {
	switch r {
	case '"':
		return append(dst, '\\', '"')
	case '\\':
		return append(dst, '\\', '\\')
	case '\b':
		return append(dst, '\\', 'b')
	case '\f':
		return append(dst, '\\', 'f')
	case '\n':
		return append(dst, '\\', 'n')
	case '\r':
		return append(dst, '\\', 'r')
	case '\t':
		return append(dst, '\\', 't')
	}
	if r < 0x20 {
		const hex = "0123456789abcdef"
		return append(dst, '\\', 'u', '0', '0', hex[r>>4], hex[r&0xf])
	}
	return utf8.AppendRune(dst, r)
}

// number reads a JSON number and writes its exact canonical form: the
// significant digits (leading and trailing zeros removed) laid out as
// ECMAScript's Number::toString lays out the digits of a double.
func (c *canonicalizer) number() error {
	src := c.src
	neg := false
	if src[c.pos] == '-' {
		neg = true
		c.pos++
	}
	intStart := c.pos
	if c.pos >= len(src) || src[c.pos] < '0' || src[c.pos] > '9' {
		return c.errorf("expected a digit")
	}
	if src[c.pos] == '0' {
		c.pos++
	} else {
		for c.pos < len(src) && src[c.pos] >= '0' && src[c.pos] <= '9' {
			c.pos++
		}
	}
	intDigits := src[intStart:c.pos]
	plain := c.pos >= len(src) || (src[c.pos] != '.' && src[c.pos] != 'e' && src[c.pos] != 'E')
	if plain && len(intDigits) <= 21 {
		// An integer of up to 21 digits, without fraction or exponent, is
		// already canonical (ECMAScript writes it digit for digit), except
		// that -0 is written 0.
		if neg && intDigits[0] != '0' {
			c.dst = append(c.dst, '-')
		}
		c.dst = append(c.dst, intDigits...)
		return nil
	}
	var fracDigits []byte
	if c.pos < len(src) && src[c.pos] == '.' {
		c.pos++
		fs := c.pos
		for c.pos < len(src) && src[c.pos] >= '0' && src[c.pos] <= '9' {
			c.pos++
		}
		if c.pos == fs {
			return c.errorf("expected a digit after the decimal point")
		}
		fracDigits = src[fs:c.pos]
	}
	var exp int64
	if c.pos < len(src) && (src[c.pos] == 'e' || src[c.pos] == 'E') {
		c.pos++
		expNeg := false
		if c.pos < len(src) && (src[c.pos] == '+' || src[c.pos] == '-') {
			expNeg = src[c.pos] == '-'
			c.pos++
		}
		es := c.pos
		for c.pos < len(src) && src[c.pos] >= '0' && src[c.pos] <= '9' {
			// Exponents beyond 10^15 would overflow the arithmetic below;
			// no real request carries one, so refuse rather than round.
			if exp > 1e15 {
				return c.errorf("exponent out of range")
			}
			exp = exp*10 + int64(src[c.pos]-'0')
			c.pos++
		}
		if c.pos == es {
			return c.errorf("expected a digit in the exponent")
		}
		if expNeg {
			exp = -exp
		}
	}

	// The value is 0.D x 10^n where D is intDigits followed by fracDigits,
	// with leading and trailing zeros stripped.
	if len(intDigits) == 1 && intDigits[0] == '0' {
		intDigits = nil
	}
	n := int64(len(intDigits)) + exp
	digits := joinDigits(intDigits, fracDigits)
	lead := 0
	for lead < len(digits) && digits[lead] == '0' {
		lead++
	}
	digits = digits[lead:]
	n -= int64(lead)
	for len(digits) > 0 && digits[len(digits)-1] == '0' {
		digits = digits[:len(digits)-1]
	}
	if len(digits) == 0 {
		c.dst = append(c.dst, '0')
		return nil
	}
	if neg {
		c.dst = append(c.dst, '-')
	}
	c.dst = appendDigits(c.dst, digits, n)
	return nil
}

// joinDigits returns the integer and fraction digits as one sequence,
// without copying when there is no fraction.
func joinDigits(i, f []byte) []byte {
	if len(f) == 0 {
		return i
	}
	if len(i) == 0 {
		return f
	}
	d := make([]byte, 0, len(i)+len(f))
	return append(append(d, i...), f...)
}

// appendDigits lays out the significant digits d (no leading or trailing
// zeros) of the value 0.d x 10^n as ECMAScript Number::toString does.
func appendDigits(dst, d []byte, n int64) []byte {
	k := int64(len(d))
	switch {
	case k <= n && n <= 21:
		dst = append(dst, d...)
		for i := k; i < n; i++ {
			dst = append(dst, '0')
		}
	case 0 < n && n <= 21:
		dst = append(dst, d[:n]...)
		dst = append(dst, '.')
		dst = append(dst, d[n:]...)
	case -6 < n && n <= 0:
		dst = append(dst, '0', '.')
		for i := n; i < 0; i++ {
			dst = append(dst, '0')
		}
		dst = append(dst, d...)
	default:
		dst = append(dst, d[0])
		if k > 1 {
			dst = append(dst, '.')
			dst = append(dst, d[1:]...)
		}
		dst = append(dst, 'e')
		if e := n - 1; e >= 0 {
			dst = append(dst, '+')
			dst = strconv.AppendInt(dst, e, 10)
		} else {
			dst = strconv.AppendInt(dst, e, 10)
		}
	}
	return dst
}
