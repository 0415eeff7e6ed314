package idem

import (
	"errors"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("a", MaxKeyLength)
	tests := []struct {
		name   string
		values []string
		want   string
		err    error
	}{
		{"quoted", []string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"bare", []string{`8e03978e-40d5-43e8-bc93-6894a57f9324`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"quoted with escapes", []string{`"a\"b\\c"`}, `a"b\c`, nil},
		{"quoted with parameters", []string{`"abc";v=1`}, "abc", nil},
		{"surrounding whitespace", []string{"  \"abc\"\t"}, "abc", nil},
		{"bare surrounding whitespace", []string{" abc "}, "abc", nil},
		{"inner space", []string{`"a b"`}, "a b", nil},
		{"comma inside quotes", []string{`"a,b"`}, "a,b", nil},
		{"max length quoted", []string{`"` + long + `"`}, long, nil},
		{"max length bare", []string{long}, long, nil},
		{"single char", []string{"x"}, "x", nil},

		{"missing", nil, "", ErrKeyMissing},
		{"two fields", []string{`"a"`, `"b"`}, "", ErrKeyInvalid},
		{"two equal fields", []string{`"a"`, `"a"`}, "", ErrKeyInvalid},
		{"list quoted", []string{`"a", "b"`}, "", ErrKeyInvalid},
		{"list bare", []string{`a, b`}, "", ErrKeyInvalid},
		{"empty", []string{""}, "", ErrKeyInvalid},
		{"only whitespace", []string{"   "}, "", ErrKeyInvalid},
		{"empty quoted", []string{`""`}, "", ErrKeyInvalid},
		{"too long quoted", []string{`"` + long + `a"`}, "", ErrKeyInvalid},
		{"too long bare", []string{long + "a"}, "", ErrKeyInvalid},
		{"non-ASCII quoted", []string{`"ключ"`}, "", ErrKeyInvalid},
		{"non-ASCII bare", []string{"clé"}, "", ErrKeyInvalid},
		{"control char", []string{"a\x01b"}, "", ErrKeyInvalid},
		{"DEL", []string{"a\x7fb"}, "", ErrKeyInvalid},
		{"tab inside", []string{"a\tb"}, "", ErrKeyInvalid},
		{"unterminated quote", []string{`"abc`}, "", ErrKeyInvalid},
		{"stray quote bare", []string{`ab"c`}, "", ErrKeyInvalid},
		{"trailing garbage", []string{`"abc" x`}, "", ErrKeyInvalid},
		{"bad escape", []string{`"a\nb"`}, "", ErrKeyInvalid},
		{"token not string", []string{`"abc";`}, "", ErrKeyInvalid},
		{"integer item", []string{`"`}, "", ErrKeyInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseKey(tt.values)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("ParseKey(%q) = %q, %v; want error %v", tt.values, got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q", tt.values, got, err, tt.want)
			}
		})
	}
}

func TestFormatKeyRoundTrip(t *testing.T) {
	for _, k := range []string{"abc", `a"b`, `a\b`, `"\`, "with space", strings.Repeat("z", MaxKeyLength)} {
		got, err := ParseKey([]string{FormatKey(k)})
		if err != nil || got != k {
			t.Errorf("ParseKey(FormatKey(%q)) = %q, %v", k, got, err)
		}
	}
}

// FuzzParseKey checks that any accepted key is 1-255 printable ASCII
// characters, and that it survives FormatKey unchanged.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, "abc", `"a\"b"`, `"a";x=1`, `"a", "b"`, "", `"`, `"\`, "a,b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := ParseKey([]string{v})
		if err != nil {
			if !errors.Is(err, ErrKeyInvalid) {
				t.Fatalf("ParseKey(%q) error %v does not wrap ErrKeyInvalid", v, err)
			}
			return
		}
		if len(k) == 0 || len(k) > MaxKeyLength {
			t.Fatalf("ParseKey(%q) accepted a key of length %d", v, len(k))
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x20 || k[i] > 0x7e {
				t.Fatalf("ParseKey(%q) accepted byte %#x", v, k[i])
			}
		}
		again, err := ParseKey([]string{FormatKey(k)})
		if err != nil || again != k {
			t.Fatalf("ParseKey(FormatKey(%q)) = %q, %v", k, again, err)
		}
	})
}
