package canonjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"testing"
	"unicode/utf8"
)

func canon(t *testing.T, in string) string {
	t.Helper()
	out, err := Append(nil, []byte(in))
	if err != nil {
		t.Fatalf("Append(%q): %v", in, err)
	}
	return string(out)
}

func TestCanonicalJSON(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\":{}} ", `{"a":[1,2],"b":{}}`},
		{`[]`, `[]`},
		{`{}`, `{}`},
		{`"x"`, `"x"`},
		{`null`, `null`},
		{`[true,false,null]`, `[true,false,null]`},
		{`{"z":{"y":1,"x":2},"a":[{"d":1,"c":2}]}`, `{"a":[{"c":2,"d":1}],"z":{"x":2,"y":1}}`},
		// Strings: minimal escapes, lower-case \u00xx, everything else literal.
		{`"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/"`, `"€$\u000f\nA'B\"\\\\\"/"`},
		{`"\b\f\n\r\t"`, `"\b\f\n\r\t"`},
		{`"\u001f\u007f\u2028"`, "\"\\u001f\x7f\u2028\""},
		{`"\ud83d\ude00"`, `"😀"`},
		{`"😀"`, `"😀"`},
		// RFC 8785's sorting example: UTF-16 code unit order puts U+1F600
		// (a surrogate pair) before U+FB33.
		{`{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}`,
			`{"\r":"Carriage Return","1":"One","` + "\u0080" + `":"Control","ö":"Latin Small Letter O With Diaeresis","€":"Euro Sign","😀":"Emoji: Grinning Face","דּ":"Hebrew Letter Dalet With Dagesh"}`},
		// Numbers: exact value, ECMAScript layout.
		{`1`, `1`}, {`1.0`, `1`}, {`1e0`, `1`}, {`10e-1`, `1`}, {`0.1e1`, `1`}, {`1.000`, `1`},
		{`-0`, `0`}, {`0.0`, `0`}, {`-0.0e5`, `0`}, {`0e-7`, `0`},
		{`100`, `100`}, {`1E2`, `100`}, {`-1.5E+3`, `-1500`},
		{`1e20`, `100000000000000000000`}, {`1e21`, `1e+21`}, {`1.5e21`, `1.5e+21`},
		{`123e-2`, `1.23`}, {`0.000001`, `0.000001`}, {`0.0000001`, `1e-7`}, {`2e-3`, `0.002`},
		{`4.50`, `4.5`}, {`1E30`, `1e+30`}, {`0.000000000000000000000000001`, `1e-27`},
		{`9007199254740993`, `9007199254740993`},
		{`12345678901234567890123`, `1.2345678901234567890123e+22`},
		{`0.12345678901234567`, `0.12345678901234567`},
		{`1.5e400`, `1.5e+400`}, {`-2.5e-400`, `-2.5e-400`},
		{`00.5e1`[1:], `5`},
	}
	for _, tt := range tests {
		if got := canon(t, tt.in); got != tt.want {
			t.Errorf("canonical(%s)\n got %s\nwant %s", tt.in, got, tt.want)
		}
	}
}

func TestCanonicalJSONRejects(t *testing.T) {
	deep := strings.Repeat("[", maxJSONDepth+1) + strings.Repeat("]", maxJSONDepth+1)
	for _, in := range []string{
		``, ` `, `{`, `[1,]`, `{"a":1,}`, `{"a"}`, `{"a":}`, `{a:1}`, `01`, `1.`, `.5`, `1e`, `+1`, `-`,
		`NaN`, `Infinity`, `tru`, `nul`, `"abc`, `"\x"`, `"\u12"`, "\"a\x01b\"", `// c` + "\n1", `1 2`, `[1] x`,
		`{"a":1,"a":2}`, `{"a":1,"\u0061":2}`, `{"b":{"x":1,"x":1}}`,
		"\"\xff\"", "{\"a\xc3\":1}", `"\ud800"`, `"\udc00"`, `"\ud800\u0041"`, `"\ud800x"`,
		`1e9999999999999999999`, deep,
	} {
		if out, err := Append(nil, []byte(in)); !errors.Is(err, ErrInvalid) {
			t.Errorf("Append(%q) = %q, %v; want ErrInvalid", in, out, err)
		}
	}
	// Exactly at the depth limit is fine.
	ok := strings.Repeat("[", maxJSONDepth) + strings.Repeat("]", maxJSONDepth)
	if _, err := Append(nil, []byte(ok)); err != nil {
		t.Errorf("nesting of %d rejected: %v", maxJSONDepth, err)
	}
}

func TestCanonicalJSONKeepsDst(t *testing.T) {
	dst := []byte("prefix:")
	out, err := Append(dst, []byte(`{"b":[1,2],"a":"x"}`))
	if err != nil || string(out) != `prefix:{"a":"x","b":[1,2]}` {
		t.Fatalf("got %q, %v", out, err)
	}
	if out, err := Append(dst, []byte(`{"a":1,"a":1}`)); err == nil || string(out) != "prefix:" {
		t.Fatalf("on error got %q, %v; want dst unchanged", out, err)
	}
}

// FuzzCanonicalJSON checks, for any input, that the canonicaliser accepts
// only valid JSON; that its output is valid JSON meaning exactly the same
// thing (numbers compared as exact rationals); and that canonicalising is
// idempotent.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[1.0,2e3,-0,"x\u00e9"]}`, `9007199254740993`, `{"a":{"b":{"c":[]}}}`,
		`"\ud83d\ude00"`, `[0.1e1, 10e-1, 1E+2]`, `{"a":1,"\u0061":2}`, `{"é":1,"e":2,"😀":3,"דּ":4}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Append(nil, in)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
			return
		}
		if !json.Valid(in) || !utf8.Valid(in) {
			t.Fatalf("accepted invalid JSON %q", in)
		}
		if !json.Valid(out) {
			t.Fatalf("output %q of %q is not valid JSON", out, in)
		}
		again, err := Append(nil, out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %q -> %q -> %q (%v)", in, out, again, err)
		}
		if !sameJSON(t, in, out) {
			t.Fatalf("%q and its canonical form %q differ in meaning", in, out)
		}
	})
}

// sameJSON reports whether two JSON texts denote the same value, comparing
// numbers exactly.
func sameJSON(t *testing.T, a, b []byte) bool {
	decode := func(s []byte) any {
		d := json.NewDecoder(bytes.NewReader(s))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("decode %q: %v", s, err)
		}
		return v
	}
	return equalJSON(decode(a), decode(b))
}

func equalJSON(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if w, ok := y[k]; !ok || !equalJSON(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equalJSON(x[i], y[i]) {
				return false
			}
		}
		return true
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		if hugeExponent(string(x)) || hugeExponent(string(y)) {
			// Too large for exact arithmetic in a test; the table tests
			// cover the layout of such numbers.
			return true
		}
		rx, okx := new(big.Rat).SetString(string(x))
		ry, oky := new(big.Rat).SetString(string(y))
		if !okx || !oky {
			// Exponents too large for big.Rat: compare canonical spellings.
			return string(x) == string(y)
		}
		return rx.Cmp(ry) == 0
	default:
		return a == b
	}
}

func hugeExponent(n string) bool {
	i := strings.IndexAny(n, "eE")
	if i < 0 {
		return false
	}
	e := strings.TrimLeft(n[i+1:], "+-")
	e = strings.TrimLeft(e, "0")
	return len(e) > 4
}
