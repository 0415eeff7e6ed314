package console

import (
	"html/template"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/idemhq/idem"
)

// What the console shows comes from clients: keys, scopes, header fields,
// bodies, step data, reasons in errors. Every such string takes one of
// the paths below, and no other:
//
//   - into a page: through html/template only (never template.HTML and
//     friends), after printable, which quotes control characters;
//   - into markup built as a string (the SVG chart): escapeHTML;
//   - into a log: never a key in clear; redactKey replaces it in an
//     error's text, and attributes use idem.RedactKey.

// escapeHTML escapes s for HTML or SVG text and attribute values, as
// html/template does for the pages.
func escapeHTML(s string) string { return template.HTMLEscapeString(s) }

// printable returns b as text when it is UTF-8 without control characters
// (line breaks and tabs kept), and Go-quoted otherwise. The template
// escapes it for HTML either way.
func printable(b []byte) string {
	if utf8.Valid(b) && !strings.ContainsFunc(string(b), func(r rune) bool {
		return r != '\n' && r != '\t' && r != '\r' && unicode.IsControl(r) || r == utf8.RuneError
	}) {
		return string(b)
	}
	return strconv.Quote(string(b))
}

// redactKey returns err with every occurrence of key in its text (as it
// is, and Go-quoted, as %q writes it) replaced by idem.RedactKey(key), for
// logs and pages; errors.Is and errors.As still see err.
func redactKey(err error, key string) error {
	if err == nil || key == "" {
		return err
	}
	msg := err.Error()
	red := idem.RedactKey(key)
	out := strings.ReplaceAll(msg, strconv.Quote(key), red)
	out = strings.ReplaceAll(out, key, red)
	if out == msg {
		return err
	}
	return redactedError{msg: out, err: err}
}

type redactedError struct {
	msg string
	err error
}

func (e redactedError) Error() string { return e.msg }
func (e redactedError) Unwrap() error { return e.err }
