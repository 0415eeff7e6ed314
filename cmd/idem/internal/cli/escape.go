package cli

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// What the operator commands print comes from records, which come from
// clients and upstreams: a stored body, a header field, a scope built from
// a tenant name. None of it reaches the terminal raw. Control characters
// (C0, DEL, C1, ESC among them), Unicode format characters (such as the
// bidirectional overrides) and bytes that are not UTF-8 are written as Go
// escapes: \x1b, \u009b, \u202e, \xff. An OSC 52 sequence in a body, which
// would set the terminal's clipboard, prints as the text \x1b]52;c;...

// termField returns a scope, key or record ID as one field of terminal
// output: as it is when it is printable UTF-8 with no space and does not
// start with a double quote, and otherwise in Go's quoted form
// (strconv.Quote: "4:acme|POST /payments"), which argField reads back.
func termField(s string) string {
	if s != "" && s[0] != '"' && !strings.ContainsFunc(s, func(r rune) bool { return r == ' ' || escaped(r) }) &&
		utf8.ValidString(s) {
		return s
	}
	return strconv.Quote(s)
}

// argField reads a --scope, KEY or record ID argument: an argument that
// starts with a double quote is the quoted form termField prints, and
// must be one; any other argument is the value itself.
func argField(arg string) (string, error) {
	if !strings.HasPrefix(arg, `"`) {
		return arg, nil
	}
	s, err := strconv.Unquote(arg)
	if err != nil {
		return "", errors.New("it starts with a double quote but is not a quoted value as idem ls prints it (\"...\" with Go escapes such as \\\" and \\x1b)")
	}
	return s, nil
}

// escaped reports whether r is written as an escape: a control or format
// character, or anything else that is not printable (strconv.IsPrint:
// letters, marks, numbers, punctuation, symbols and the ASCII space).
func escaped(r rune) bool { return !strconv.IsPrint(r) }

// termText escapes s for a terminal and reports how many characters it
// escaped. A multi-line text (a body) keeps its newlines and tabs; in a
// one-line text (a header field) they are escaped too.
func termText(s string, multiline bool) (string, int) {
	clean := func(r rune) bool {
		return escaped(r) && !(multiline && (r == '\n' || r == '\t'))
	}
	if utf8.ValidString(s) && !strings.ContainsFunc(s, clean) {
		return s, 0
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
			n++
		case clean(r):
			q := strconv.QuoteRune(r) // '\x1b', '\u202e'
			b.WriteString(q[1 : len(q)-1])
			n++
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String(), n
}

// jsonString returns how the --json output gives a scope, key or record ID,
// and whether that is its quoted form: the value itself when it is UTF-8
// and does not start with a double quote (JSON escapes the rest), and
// otherwise the quoted form termField prints, which argField reads back, so
// that passing the field on to --scope or KEY always names the record.
func jsonString(s string) (string, bool) {
	if utf8.ValidString(s) && !strings.HasPrefix(s, `"`) {
		return s, false
	}
	return strconv.Quote(s), true
}

// escapeJSON rewrites, in encoded JSON, every character that escaped
// reports and encoding/json leaves raw (DEL, C1 controls, format
// characters; it escapes C0 itself) as a \u escape, so that no such
// character reaches a terminal that prints the JSON. They only occur inside
// strings, where the escape decodes to the same character. encoding/json
// writes valid UTF-8 only.
func escapeJSON(b []byte) []byte {
	raw := func(r rune) bool { return r >= 0x7f && escaped(r) } // below DEL, encoding/json escaped what needs it
	i := bytes.IndexFunc(b, raw)
	if i < 0 {
		return b
	}
	out := make([]byte, 0, len(b)+32)
	for i >= 0 {
		out = append(out, b[:i]...)
		r, size := utf8.DecodeRune(b[i:])
		if r > 0xffff {
			hi, lo := utf16.EncodeRune(r)
			out = fmt.Appendf(out, `\u%04x\u%04x`, hi, lo)
		} else {
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		b = b[i+size:]
		i = bytes.IndexFunc(b, raw)
	}
	return append(out, b...)
}
