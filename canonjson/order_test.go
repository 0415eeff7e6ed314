package canonjson

import (
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"
)

// TestCanonicalJSONGolden pins the exact output for objects that exercise
// member sorting and duplicate detection. The outputs were computed with the
// implementation as it was before sorting was reworked for speed: request
// fingerprints stored with records hash this output, so it must never change.
func TestCanonicalJSONGolden(t *testing.T) {
	k299, k300 := strings.Repeat("k", 299), strings.Repeat("k", 300)
	e100 := strings.Repeat("é", 100)
	tests := []struct {
		in, want string
		bad      bool
	}{
		// Sizes around the small-object threshold, sorted, reversed, shuffled.
		{`{"a":0,"b":1,"c":2,"d":3,"e":4,"f":5,"g":6,"h":7,"i":8,"j":9,"k":10}`, `{"a":0,"b":1,"c":2,"d":3,"e":4,"f":5,"g":6,"h":7,"i":8,"j":9,"k":10}`, false},
		{`{"k":0,"j":1,"i":2,"h":3,"g":4,"f":5,"e":6,"d":7,"c":8,"b":9,"a":10}`, `{"a":10,"b":9,"c":8,"d":7,"e":6,"f":5,"g":4,"h":3,"i":2,"j":1,"k":0}`, false},
		{`{"l":0,"k":1,"j":2,"i":3,"h":4,"g":5,"f":6,"e":7,"d":8,"c":9,"b":10,"a":11}`, `{"a":11,"b":10,"c":9,"d":8,"e":7,"f":6,"g":5,"h":4,"i":3,"j":2,"k":1,"l":0}`, false},
		{`{"a":0,"b":1,"c":2,"d":3,"e":4,"f":5,"g":6,"h":7,"i":8,"j":9,"k":10,"l":11,"m":12}`, `{"a":0,"b":1,"c":2,"d":3,"e":4,"f":5,"g":6,"h":7,"i":8,"j":9,"k":10,"l":11,"m":12}`, false},
		{`{"m":0,"l":1,"k":2,"j":3,"i":4,"h":5,"g":6,"f":7,"e":8,"d":9,"c":10,"b":11,"a":12}`, `{"a":12,"b":11,"c":10,"d":9,"e":8,"f":7,"g":6,"h":5,"i":4,"j":3,"k":2,"l":1,"m":0}`, false},
		{`{"g":0,"m":1,"b":2,"k":3,"a":4,"d":5,"l":6,"f":7,"h":8,"c":9,"j":10,"e":11,"i":12}`, `{"a":4,"b":2,"c":9,"d":5,"e":11,"f":7,"g":0,"h":8,"i":12,"j":10,"k":3,"l":6,"m":1}`, false},
		{`{"z":0,"y":1,"x":2,"w":3,"v":4,"u":5,"t":6,"s":7,"r":8,"q":9,"p":10,"o":11,"n":12,"m":13,"l":14,"k":15,"j":16,"i":17,"h":18,"g":19,"f":20,"e":21,"d":22,"c":23,"b":24,"a":25}`, `{"a":25,"b":24,"c":23,"d":22,"e":21,"f":20,"g":19,"h":18,"i":17,"j":16,"k":15,"l":14,"m":13,"n":12,"o":11,"p":10,"q":9,"r":8,"s":7,"t":6,"u":5,"v":4,"w":3,"x":2,"y":1,"z":0}`, false},
		{`{"q":0,"a":1,"z":2,"w":3,"s":4,"x":5,"e":6,"d":7,"c":8,"r":9,"f":10,"v":11,"t":12,"g":13,"b":14,"y":15,"h":16,"n":17,"u":18,"j":19,"m":20,"i":21,"k":22,"o":23,"l":24,"p":25}`, `{"a":1,"b":14,"c":8,"d":7,"e":6,"f":10,"g":13,"h":16,"i":21,"j":19,"k":22,"l":24,"m":20,"n":17,"o":23,"p":25,"q":0,"r":9,"s":4,"t":12,"u":18,"v":11,"w":3,"x":5,"y":15,"z":2}`, false},
		// Duplicates at various places and sizes.
		{`{"a":0,"b":1,"a":2}`, "", true},
		{`{"b":0,"a":1,"b":2}`, "", true},
		{`{"a":0,"a":1}`, "", true},
		{`{"a":0,"b":1,"c":2,"d":3,"e":4,"f":5,"g":6,"h":7,"i":8,"j":9,"k":10,"l":11,"a":12}`, "", true},
		{`{"l":0,"k":1,"j":2,"i":3,"h":4,"g":5,"f":6,"e":7,"d":8,"c":9,"b":10,"a":11,"l":12}`, "", true},
		{`{"m":0,"l":1,"k":2,"j":3,"i":4,"h":5,"g":6,"f":7,"e":8,"d":9,"c":10,"b":11,"a":12,"g":13}`, "", true},
		{`{"a":0,"b":1,"c":2,"d":3,"e":4,"f":5,"g":6,"h":7,"i":8,"j":9,"k":10,"l":11,"m":12,"n":13,"o":14,"p":15,"p":16}`, "", true},
		{`{"p":0,"o":1,"n":2,"m":3,"l":4,"k":5,"j":6,"i":7,"h":8,"g":9,"f":10,"e":11,"d":12,"c":13,"b":14,"a":15,"h":16}`, "", true},
		{`{"a":0,"\u0061":1}`, "", true},
		{`{"\u0062":0,"a":1,"b":2}`, "", true},
		{`{"é":0,"\u00e9":1}`, "", true},
		{`{"😀":0,"\ud83d\ude00":1}`, "", true},
		{`{"x":0,"y":1,"\ud83d\ude00":2,"z":3,"😀":4}`, "", true},
		// Prefixes, empty names, NUL.
		{`{"ab":0,"a":1,"":2,"abc":3,"a\u0000":4,"b":5}`, `{"":2,"a":1,"a\u0000":4,"ab":0,"abc":3,"b":5}`, false},
		{`{"a\u0000":0,"a":1,"":2,"a\u0000b":3}`, `{"":2,"a":1,"a\u0000":0,"a\u0000b":3}`, false},
		{`{"":0,"":1}`, "", true},
		// Escapes in names and values.
		{`{"a\"b":0,"a\\b":1,"a/b":2,"a\/c":3,"\n":4,"\t":5,"\u001f":6,"\b":7}`, `{"\b":7,"\t":5,"\n":4,"\u001f":6,"a\"b":0,"a/b":2,"a/c":3,"a\\b":1}`, false},
		{`{"\u00e9t\u00e9":0,"ete":1,"\u20ac":2,"\u2028":3}`, "{\"ete\":1,\"été\":0,\"\u2028\":3,\"€\":2}", false},
		{`{"k\"1":0,"k\"0":1}`, `{"k\"0":1,"k\"1":0}`, false},
		// UTF-16 versus UTF-8 order: U+E000..U+FFFF against supplementary.
		{"{\"\ue000\":0,\"𐀀\":1,\"\uffff\":2,\"\U0010ffff\":3,\"�\":4,\"\ud7ff\":5,\"😀\":6}", "{\"\ud7ff\":5,\"𐀀\":1,\"😀\":6,\"\U0010ffff\":3,\"\ue000\":0,\"�\":4,\"\uffff\":2}", false},
		{"{\"a\uffff\":0,\"a𐀀\":1,\"a\ue000\":2,\"a\":3}", "{\"a\":3,\"a𐀀\":1,\"a\ue000\":2,\"a\uffff\":0}", false},
		{"{\"\uffffb\":0,\"𐀀a\":1,\"\uffffa\":2}", "{\"𐀀a\":1,\"\uffffa\":2,\"\uffffb\":0}", false},
		{"{\"😀\":0,\"😁\":1,\"🗿\":2,\"𠀀\":3,\"\U0010fffd\":4}", "{\"🗿\":2,\"😀\":0,\"😁\":1,\"𠀀\":3,\"\U0010fffd\":4}", false},
		{"{\"\u0080\":0,\"߿\":1,\"ࠀ\":2,\"翿\":3,\"\ud7ff\":4,\"\ue000\":5,\"\uefff\":6,\"\uf000\":7,\"\uffff\":8,\"𐀀\":9}", "{\"\u0080\":0,\"߿\":1,\"ࠀ\":2,\"翿\":3,\"\ud7ff\":4,\"𐀀\":9,\"\ue000\":5,\"\uefff\":6,\"\uf000\":7,\"\uffff\":8}", false},
		{"{\"\uef00x\":0,\"\uee00\":1,\"\U00040000\":2,\"豈\":3,\"\U000f0000\":4}", "{\"\U00040000\":2,\"\U000f0000\":4,\"\uee00\":1,\"\uef00x\":0,\"豈\":3}", false},
		{`{"\ue000":0,"\ud800\udc00":1,"\uffff":2,"\udbff\udfff":3}`, "{\"𐀀\":1,\"\U0010ffff\":3,\"\ue000\":0,\"\uffff\":2}", false},
		{"{\"a\":0,\"b\":1,\"c\":2,\"d\":3,\"e\":4,\"f\":5,\"g\":6,\"h\":7,\"i\":8,\"j\":9,\"k\":10,\"l\":11,\"m\":12,\"\ue000\":13,\"𐀀\":14,\"\uffff\":15}", "{\"a\":0,\"b\":1,\"c\":2,\"d\":3,\"e\":4,\"f\":5,\"g\":6,\"h\":7,\"i\":8,\"j\":9,\"k\":10,\"l\":11,\"m\":12,\"𐀀\":14,\"\ue000\":13,\"\uffff\":15}", false},
		{`{"𐀀":0,"𐀁":1,"𐀀":2}`, "", true},
		{"{\"\uffff\":0,\"𐀀\":1,\"\uffff\":2}", "", true},
		// Nesting: unsorted inside unsorted, arrays of objects, errors deep inside.
		{`{"z":{"y":{"x":{"w":1,"v":2},"u":3},"t":[{"s":1,"r":2},{"q":[{"p":1,"o":0}]}]},"a":{"c":1,"b":2}}`, `{"a":{"b":2,"c":1},"z":{"t":[{"r":2,"s":1},{"q":[{"o":0,"p":1}]}],"y":{"u":3,"x":{"v":2,"w":1}}}}`, false},
		{`[{"b":1,"a":2},{"d":{"f":1,"e":2},"c":3},[],{},[{}]]`, `[{"a":2,"b":1},{"c":3,"d":{"e":2,"f":1}},[],{},[{}]]`, false},
		{`{"b":{"a":1,"a":2},"a":1}`, "", true},
		{`{"b":[{"y":1},{"y":1,"x":2,"y":3}],"a":1}`, "", true},
		{`{"a":{"b":1},"a":{"b":1}}`, "", true},
		{`{"b":{"c":1,"d":2},"a":{"d":1,"c":2},"c":{"e":{"g":1,"f":2}}}`, `{"a":{"c":2,"d":1},"b":{"c":1,"d":2},"c":{"e":{"f":2,"g":1}}}`, false},
		{" { \"b\" : { \"d\" : 1 , \"c\" : 2 } ,\n\t\"a\"\r:\n[ 1 , { \"y\":1 , \"x\":2 } ] } ", `{"a":[1,{"x":2,"y":1}],"b":{"c":2,"d":1}}`, false},
		{`{"b":1,"a":2,}`, "", true},
		{`{"b":1,"a":{"d":1,"c":}}`, "", true},
		{`{"b":1,"a":"\ud800"}`, "", true},
		{`{"\ud800":1}`, "", true},
		{`{"a\u12":1}`, "", true},
		{`{"a":1 "b":2}`, "", true},
		{`{"b":{"y":1,"x":2},"a":[1,2,{"q":1,"p":`, "", true},
		// Long names (not held in any fixed buffer).
		{`{"` + k300 + `b":0,"` + k300 + `a":1,"` + k299 + `":2}`, `{"` + k299 + `":2,"` + k300 + `a":1,"` + k300 + `b":0}`, false},
		{`{"` + e100 + "\U00010000" + `":0,"` + e100 + "\uffff" + `":1}`, `{"` + e100 + "\U00010000" + `":0,"` + e100 + "\uffff" + `":1}`, false},
	}
	for _, tt := range tests {
		out, err := Append([]byte("pre:"), []byte(tt.in))
		switch {
		case tt.bad && !errors.Is(err, ErrInvalid):
			t.Errorf("Append(%q) = %q, %v; want ErrInvalid", tt.in, out, err)
		case tt.bad && string(out) != "pre:":
			t.Errorf("Append(%q) changed dst to %q on error", tt.in, out)
		case !tt.bad && (err != nil || string(out) != "pre:"+tt.want):
			t.Errorf("Append(%q)\n got %q, %v\nwant %q", tt.in, out, err, "pre:"+tt.want)
		}
	}
}

// utf16Order is the definition compareUTF16 implements: the strings'
// UTF-16 code units compared one by one.
func utf16Order(a, b string) int {
	return slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
}

func TestCompareUTF16(t *testing.T) {
	// Characters at the edges of each UTF-8 length and of the ranges where
	// UTF-8 byte order and UTF-16 order disagree (U+E000..U+FFFF against
	// U+10000 and above, which UTF-16 writes as surrogates D800..DFFF).
	edges := []rune{
		0, 'a', 'b', 0x7f, 0x80, 0xbf, 0xc0, 0x7ff, 0x800, 0xfff, 0x1000, 0xcfff, 0xd000, 0xd7ff,
		0xe000, 0xe001, 0xedff, 0xee00, 0xefff, 0xf000, 0xf8ff, 0xfb33, 0xfffd, 0xfffe, 0xffff,
		0x10000, 0x10001, 0x103ff, 0x10400, 0x1f600, 0x3ffff, 0x40000, 0xfffff, 0x100000, 0x10fffe, 0x10ffff,
	}
	hand := []string{"", "a", "ab", "b", "a\x00", "\u00e9", "e", "\U0001f600", "\ufb33", "a\U00010000", "a\uffff", "a\ue000b", "\U00010000\U00010000"}
	for _, r := range edges {
		hand = append(hand, string(r), string(r)+"a", "a"+string(r))
	}
	for _, a := range hand {
		for _, b := range hand {
			if got, want := cmp.Compare(compareUTF16([]byte(a), []byte(b)), 0), utf16Order(a, b); got != want {
				t.Errorf("compareUTF16(%+q, %+q) = %d, want %d", a, b, got, want)
			}
		}
	}

	// Random strings over those characters and a few random ones, often
	// sharing a prefix so that the first difference falls anywhere.
	rng := rand.New(rand.NewPCG(1, 2))
	randRune := func() rune {
		switch rng.IntN(6) {
		case 0:
			return edges[rng.IntN(len(edges))]
		case 1:
			return rune(rng.IntN(0x80))
		case 2:
			return rune(0x80 + rng.IntN(0xd800-0x80))
		case 3:
			return rune(0xe000 + rng.IntN(0x2000))
		default:
			return rune(0x10000 + rng.IntN(0x100000))
		}
	}
	randString := func(prefix []rune) string {
		rs := append([]rune(nil), prefix...)
		for n := rng.IntN(4); n > 0; n-- {
			rs = append(rs, randRune())
		}
		return string(rs)
	}
	for range 200000 {
		var prefix []rune
		for n := rng.IntN(3); n > 0; n-- {
			prefix = append(prefix, randRune())
		}
		a, b := randString(prefix), randString(prefix)
		if got, want := cmp.Compare(compareUTF16([]byte(a), []byte(b)), 0), utf16Order(a, b); got != want {
			t.Fatalf("compareUTF16(%+q, %+q) = %d, want %d", a, b, got, want)
		}
	}
}
