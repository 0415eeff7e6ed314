package canonjson_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/idemhq/idem/canonjson"
)

func TestParsePointer(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
		bad  bool
	}{
		{in: "", want: nil},
		{in: "/", want: []string{""}},
		{in: "/a", want: []string{"a"}},
		{in: "/a/b/0", want: []string{"a", "b", "0"}},
		{in: "/a~1b/m~0n", want: []string{"a/b", "m~n"}},
		{in: "/~01", want: []string{"~1"}},
		{in: "a", bad: true},
		{in: "/a~", bad: true},
		{in: "/a~2", bad: true},
	} {
		got, err := canonjson.ParsePointer(c.in)
		if (err != nil) != c.bad || !slices.Equal(got, c.want) {
			t.Errorf("ParsePointer(%q) = %q, %v", c.in, got, err)
		}
	}
}

func FuzzParsePointer(f *testing.F) {
	for _, s := range []string{"", "/", "/a/b", "/a~1b/~0", "x", "/~", "/~2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tokens, err := canonjson.ParsePointer(s)
		if err != nil {
			return
		}
		// Escaping the tokens again gives back the pointer.
		var b strings.Builder
		for _, tok := range tokens {
			b.WriteString("/" + strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1"))
		}
		if b.String() != s {
			t.Errorf("%q -> %q -> %q", s, tokens, b.String())
		}
	})
}
