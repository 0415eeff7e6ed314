package idemstore_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemhq/idem/idemstore"
)

func TestListCursor(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ scope, key string }{
		{"", ""}, {"0:|POST /x", "k"}, {"a", "bc"}, {"ab", "c"}, {"4:acme|POST /payments", strings.Repeat("k", 255)},
		{"\x00\xff\x1b", " \"\\"}, {strings.Repeat("s", 300), ""},
	} {
		cur := idemstore.ListCursor(c.scope, c.key)
		if strings.ContainsFunc(cur, func(r rune) bool { return r <= ' ' || r > '~' }) {
			t.Errorf("ListCursor(%q, %q) = %q: not printable ASCII without spaces", c.scope, c.key, cur)
		}
		scope, key, err := idemstore.ParseListCursor(cur)
		if err != nil || scope != c.scope || key != c.key {
			t.Errorf("ParseListCursor(ListCursor(%q, %q)) = %q, %q, %v", c.scope, c.key, scope, key, err)
		}
	}
	if idemstore.ListCursor("a", "bc") == idemstore.ListCursor("ab", "c") {
		t.Error("two positions share a cursor")
	}
	for _, bad := range []string{"", "k1", "k1.", "k2.AAAA", "k1.!!!!", "k1.AQ", "k1.gAA", "k1.AAA=", "r1.AAAA"} {
		if _, _, err := idemstore.ParseListCursor(bad); !errors.Is(err, idemstore.ErrInvalidCursor) {
			t.Errorf("ParseListCursor(%q) = %v, want ErrInvalidCursor", bad, err)
		}
	}
}

// FuzzParseListCursor: any input is refused with ErrInvalidCursor or is
// the one cursor of the position it names.
func FuzzParseListCursor(f *testing.F) {
	f.Add(idemstore.ListCursor("0:|POST /x", "k"))
	f.Add("k1.gAA")
	f.Add("k1.")
	f.Fuzz(func(t *testing.T, s string) {
		scope, key, err := idemstore.ParseListCursor(s)
		if err != nil {
			if !errors.Is(err, idemstore.ErrInvalidCursor) {
				t.Fatalf("%q: %v does not wrap ErrInvalidCursor", s, err)
			}
			return
		}
		if c := idemstore.ListCursor(scope, key); c != s {
			t.Fatalf("%q names (%q, %q), whose cursor is %q", s, scope, key, c)
		}
	})
}
