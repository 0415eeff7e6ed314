package payments

import (
	"bytes"
	"encoding/json"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemhq/idem"
)

// checkMatchesOld fails t unless Validate and Fingerprint answer body
// exactly as validateOld and fingerprintOld do: the same normalised
// request, the same problem (status, code, title, detail, type and the
// errors map with its messages in order), the same fingerprint bytes.
func checkMatchesOld(t *testing.T, r *http.Request, body []byte) {
	t.Helper()
	n, p := Validate(body)
	wantN, wantP := validateOld(body)
	if n != wantN || !reflect.DeepEqual(p, wantP) {
		t.Fatalf("Validate(%q) = %+v, %s; the old one %+v, %s", body, n, problemString(p), wantN, problemString(wantP))
	}
	fp, err := Fingerprint(r, body)
	wantFP, wantErr := fingerprintOld(r, body)
	if !bytes.Equal(fp, wantFP) || !reflect.DeepEqual(err, wantErr) {
		t.Fatalf("Fingerprint(%q) = %q, %v; the old one %q, %v", body, fp, err, wantFP, wantErr)
	}
	if (fp == nil) != (wantFP == nil) {
		t.Fatalf("Fingerprint(%q) = %#v; the old one %#v", body, fp, wantFP)
	}
}

func problemString(p *idem.Problem) string {
	if p == nil {
		return "<nil>"
	}
	b, _ := json.Marshal(p)
	return string(b)
}

// Edge cases of each field, combined with one another below: every
// spelling of a valid value the old code accepts, and every way it refuses
// one.
var (
	equivAmounts = []string{
		`2599`, `1`, `9`, `10`, `2500`, `2599.0`, `2.599e3`, `2.599E3`, `2.599e+3`, `25990e-1`, `259900e-2`,
		`0.2599e4`, `1e3`, `1E3`, `1e0`, `1.0`, `1.000`, `0`, `-0`, `0.0`, `-0.0`, `0e5`, `-1`, `-2599`,
		`0.5`, `25.5`, `2.5e0`, `1e-1`, `1e-400`, `-1e-400`,
		`999999999999999`, `1000000000000000`, `1000000000000001`, `1e15`, `1.0e15`, `10e14`, `1e16`,
		`9999999999999999`, `10000000000000000`, `9223372036854775807`, `9223372036854775808`,
		`99999999999999999999`, `-99999999999999999999`, `-9223372036854775808`, `-9223372036854775809`,
		`1e21`, `1e22`, `1e400`, `-1e400`, `1e1000000000000000`, `1e10000000000000000`, `1e-1000000000000000`,
		`012`, `00`, `-`, `1.`, `.5`, `+1`, `1e`, `1e+`, `0x10`, `1_000`, `NaN`, `Infinity`, `١`,
		`"2599"`, `""`, `null`, `true`, `false`, `[]`, `[2599]`, `{}`, `{"a":1}`,
	}
	equivCurrencies = []string{
		`"USD"`, `"usd"`, `"Usd"`, `"ZZZ"`, `"xxx"`, `"XTS"`, `"hrk"`, `"VES"`, `"zwg"`, `" Eur "`, `"\tgbp\n"`, `"\u0055SD"`, `"\u0075sd"`, `"US\u0044"`,
		`"\busd"`, `"usd\/"`, `"\rusd\f"`, `"US"`, `"USDD"`, `""`, `"   "`, `"U$D"`, `"US1"`, `"U D"`, `"U\u0000D"`, `"\u000busd\f"`,
		`"uſd"`, `"ısd"`, `"ǆsd"`, `"ＵＳＤ"`, `"\u00a0usd\u00a0"`, "\"\u00a0usd\u3000\"", `"usd\u0085"`,
		`"\u2028usd"`, `"é€$"`, `"\ud800"`, `"\udfff"`, `"\ud83d\ude00"`, `"\x"`, `"\u12"`,
		`840`, `null`, `true`, `["USD"]`, `{"c":"USD"}`,
	}
	equivReferences = []string{
		`"order-1001"`, `"x"`, `" spaced "`, `""`, `"   "`, `"\t\n\r"`, `"a<b>&c"`, `"\u003cscript\u003e"`,
		`"a\u2028b"`, `"a\u2029b"`, "\"a\u2028b\"", `"\u2028a\u2029"`, `"\"quoted\""`, `"back\\slash"`,
		`"\/slash"`, `"tab\there"`, `"nl\nhere"`, `"\bx"`, `"x\b"`, `"\fx\f"`, `"\rx\n"`, `"\u000bx"`, `"\u001cx"`, `"a\u0000b"`, `"a\u001fb"`, `"a\u007fb"`, "\"a\x7fb\"",
		`"\u0085x"`, `"x\u0085"`, `"x\u0085y"`, `"x\u0080y"`, `"x\u009fy"`, `"x\u00a0y"`, `"\u00a0x\u00a0"`,
		`"\u3000x"`, `"\u200bx"`, `"\ufeffx"`, `"\ud83d\ude00"`, `"\uD83D\uDE00"`, "\"\U0001F600\"",
		`"\ud83d"`, `"\ude00"`, `"\ud83d\u0041"`, `"\ud83dx"`, `"\ud83d\ud83d"`, `"\ufffd"`, "\"\uFFFD\"",
		`"\u00e9"`, `"é"`, `"\x"`, `"\u12"`, `"\u12g4"`, `"\U0041"`, `"\'"`, `"unterminated`, "\"raw\ttab\"",
		`"` + strings.Repeat("r", 100) + `"`, `"` + strings.Repeat("r", 101) + `"`,
		`"` + strings.Repeat("é", 100) + `"`, `"` + strings.Repeat("é", 101) + `"`,
		`" ` + strings.Repeat("r", 100) + ` "`, `"` + strings.Repeat(`\u00e9`, 100) + `"`,
		`"` + strings.Repeat(`\u0072`, 101) + `"`, `"` + strings.Repeat("&", 100) + `"`,
		`"` + strings.Repeat("\U0001F600", 100) + `"`, `"` + strings.Repeat("\U0001F600", 101) + `"`,
		`"` + strings.Repeat("x", 300) + `"`, `"` + strings.Repeat(`\"`, 100) + `"`,
		`null`, `1`, `true`, `["x"]`, `{"r":"x"}`,
	}
)

// equivBodies are whole bodies, valid and not, beyond the combinations of
// the field values.
var equivBodies = []string{
	`{"amountCents":2599,"currency":"USD","reference":"order-1001"}`,
	`{"reference":" order ","currency":"usd","amountCents":2.599e3}`,
	"{\n  \"amountCents\": 2599,\n  \"currency\": \"USD\",\n  \"reference\": \"order-1001\"\n}\n",
	" \t\r\n{ \"amountCents\" : 2599 , \"currency\" : \"USD\" , \"reference\" : \"x\" } \t\r\n",
	`{"amountCents":1,"currency":"EUR","reference":"a","extra":1}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","extra":{"x":[1,{"y":null}]}}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","extra":{"x":1,"x":2}}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","extra":[1,2,}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","a":1,"b":2,"c":3}`,
	`{"amountCents":1,"amountCents":2,"currency":"EUR","reference":"a"}`,
	`{"amountCents":1,"amountCents":1,"currency":"EUR","reference":"a"}`,
	`{"amountCents":1,"currency":"EUR","currency":"EUR","reference":"a"}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","reference":"a"}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","refer\u0065nce":"a"}`,
	`{"amount\u0043ents":1,"currency":"EUR","reference":"a"}`,
	`{"\u0061mountCents":1,"\u0063urrency":"EUR","\u0072eference":"a"}`,
	`{"AmountCents":1,"Currency":"EUR","Reference":"a"}`,
	`{"amountcents":1,"currency":"EUR","reference":"a"}`,
	`{"amountCents ":1,"currency":"EUR","reference":"a"}`,
	`{"amountCents":1,"currency":"EUR"}`,
	`{"amountCents":1,"reference":"a"}`,
	`{"currency":"EUR","reference":"a"}`,
	`{"currency":"USD"}`,
	`{"x":1}`,
	`{"":1}`,
	`{"amountCents":1,"currency":"EUR","reference":"a",}`,
	`{,"amountCents":1,"currency":"EUR","reference":"a"}`,
	`{"amountCents":1,,"currency":"EUR","reference":"a"}`,
	`{"amountCents":1 "currency":"EUR","reference":"a"}`,
	`{"amountCents"1,"currency":"EUR","reference":"a"}`,
	`{"amountCents"::1,"currency":"EUR","reference":"a"}`,
	`{amountCents:1,"currency":"EUR","reference":"a"}`,
	`{'amountCents':1,"currency":"EUR","reference":"a"}`,
	`{"amountCents":1,"currency":"EUR","reference":"a"}x`,
	`{"amountCents":1,"currency":"EUR","reference":"a"}{}`,
	`{"amountCents":1,"currency":"EUR","reference":"a"}}`,
	`{"amountCents":1,"currency":"EUR","reference":"a"} null`,
	`{"amountCents":1,"currency":"EUR","reference":"a"`,
	`{"amountCents":1,"currency":"EUR","reference":"a`,
	`{"amountCents":1,"currency":"EUR","reference":`,
	`{"amountCents":1,"currency":"EUR","reference"`,
	`{"amountCents":1,"currency":"EUR",`,
	`{"amountCents":1`,
	`{"amountCents":`,
	`{"amountCents"`,
	`{"amountCents`,
	`{"`,
	`{`,
	`}`,
	`{}`,
	`{ }`,
	`[]`,
	`[1,2]`,
	`[{"amountCents":1,"currency":"EUR","reference":"a"}]`,
	`null`,
	` null `,
	`true`,
	`1`,
	`"x"`,
	`""`,
	``,
	` `,
	" \t\r\n",
	"\v",
	"\f{}",
	"\u00a0",
	"\u00a0{}",
	"\u2028",
	"\ufeff",
	"\ufeff{\"amountCents\":1,\"currency\":\"EUR\",\"reference\":\"a\"}",
	"\xef\xbb\xbf",
	"\xff",
	"\xff{\"amountCents\":1,\"currency\":\"EUR\",\"reference\":\"a\"}",
	"{\"amountCents\":1,\"currency\":\"EUR\",\"reference\":\"\xff\"}",
	"{\"amountCents\":1,\"currency\":\"EUR\",\"reference\":\"\xed\xa0\x80\"}",
	"{\"amountCents\":1,\"currency\":\"EUR\",\"reference\":\"\xc0\xaf\"}",
	"{\"amountCents\":1,\"currency\":\"EUR\",\"reference\":\"a\"}\xff",
	"{\"amountCents\":1,\"currency\":\"EUR\",\"reference\":\"a\"}\x00",
	"{\"amountCents\":1,\"currency\":\"EUR\",\"reference\":\"a\x00b\"}",
	"{\"amountCents\":1,\"currency\":\"EUR\",\"reference\":\"a\nb\"}",
	"{\"amountCents\":1,\"currency\":\"EUR\",\"xx\xff\":1,\"reference\":\"a\"}",
	"{\"amountCents\":1,\u00a0\"currency\":\"EUR\",\"reference\":\"a\"}",
	"{\"amountCents\":1,\v\"currency\":\"EUR\",\"reference\":\"a\"}",
	`{"amountCents":1,"currency":"EUR","reference":"a","x":` + strings.Repeat("[", 600) + strings.Repeat("]", 600) + `}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","x":` + strings.Repeat("[", 511) + strings.Repeat("]", 511) + `}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","x":` + strings.Repeat(`{"a":`, 600) + `1` + strings.Repeat("}", 600) + `}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","x":` + strings.Repeat("[", 600),
	`{"amountCents":1,"currency":"EUR","reference":"a","x":tru}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","x":nul}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","x":True}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","\ud800":1}`,
	`{"amountCents":1,"currency":"EUR","reference":"a","\ud83d\ude00":1,"\uD83D\uDE00":2}`,
	`{"b":1,"a":2,"b":3}`,
	`{"amountCents":null,"currency":null,"reference":null}`,
	`{"amountCents":"","currency":"","reference":""}`,
	`{"amountCents":[],"currency":{},"reference":[]}`,
	`{"amountCents":0,"currency":"US","reference":""}`,
	`{"amountCents":-1,"currency":"dollars","reference":"","tip":2,"note":"x"}`,
}

// equivLayouts lay out the three members of a combination.
var equivLayouts = []func(a, c, r string) string{
	func(a, c, r string) string {
		return `{"amountCents":` + a + `,"currency":` + c + `,"reference":` + r + `}`
	},
	func(a, c, r string) string {
		return "\n{ \"reference\" :\t" + r + " ,\r\n \"currency\": " + c + ",\"amountCents\" : " + a + " }\n"
	},
}

// TestValidateMatchesOld compares the new Validate and Fingerprint with the
// old ones over the edge cases of each field, combined, and over whole
// bodies.
func TestValidateMatchesOld(t *testing.T) {
	bodies, fast := 0, 0
	check := func(body string) {
		bodies++
		var scratch [128]byte
		if _, ok := parseFast([]byte(body), scratch[:0]); ok {
			fast++
		}
		checkMatchesOld(t, nil, []byte(body))
	}
	for _, body := range equivBodies {
		check(body)
	}
	// Every pair of edge cases of two fields, the third one valid or not,
	// in each layout (invalid thirds in the first one only).
	third := [3][]string{{equivAmounts[0], `0`}, {equivCurrencies[0], `null`}, {equivReferences[0], `""`}}
	for li, layout := range equivLayouts {
		for ti := range third[0][:2-li] {
			for _, a := range equivAmounts {
				for _, c := range equivCurrencies {
					check(layout(a, c, third[2][ti]))
				}
				for _, r := range equivReferences {
					check(layout(a, third[1][ti], r))
				}
			}
			for _, c := range equivCurrencies {
				for _, r := range equivReferences {
					check(layout(third[0][ti], c, r))
				}
			}
		}
	}
	// Each field alone, missing one of the others, with an unknown one.
	for _, a := range equivAmounts {
		check(`{"amountCents":` + a + `}`)
		check(`{"amountCents":` + a + `,"currency":"USD","reference":"x","tip":` + a + `}`)
	}
	for _, c := range equivCurrencies {
		check(`{"currency":` + c + `,"reference":"x"}`)
		check(`{"amountCents":1,"currency":` + c + `,"reference":"x","currency2":` + c + `}`)
	}
	for _, r := range equivReferences {
		check(`{"reference":` + r + `}`)
		check(`{"amountCents":1,"currency":"USD","reference":"x",` + r + `:1}`)
		check(`{"amountCents":1,"currency":"USD",` + r + `:"x"}`)
	}
	t.Logf("%d bodies, %d of them valid on the fast path", bodies, fast)
}

// TestFingerprintContentTypeMatchesOld compares Fingerprint with the old
// one on requests with and without a JSON Content-Type, since it no longer
// parses the usual one.
func TestFingerprintContentTypeMatchesOld(t *testing.T) {
	valid := []byte(`{"amountCents":2599,"currency":"USD","reference":"order-1001"}`)
	invalidBody := []byte(`{"amountCents":0}`)
	for _, cts := range [][]string{
		nil, {""}, {"application/json"}, {"application/JSON"}, {"Application/Json"}, {"application/json "},
		{" application/json"}, {"application/json; charset=utf-8"}, {"application/json;charset=UTF-8"},
		{"application/json;"}, {"application/json; charset"}, {"application/merchant+json"},
		{"application/merchant+json; v=1"}, {"application/+json"}, {"text/json"}, {"text/plain"},
		{"application/jsonx"}, {"application/x-www-form-urlencoded"}, {"application/json", "text/plain"},
		{"text/plain", "application/json"}, {"application/json\x00"}, {"application/json/x"},
	} {
		r, err := http.NewRequest(http.MethodPost, "/api/payments", nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, ct := range cts {
			r.Header.Add("Content-Type", ct)
		}
		for _, body := range [][]byte{valid, invalidBody, nil} {
			checkMatchesOld(t, r, body)
		}
	}
	// A request without a header map at all.
	checkMatchesOld(t, &http.Request{}, valid)
}

// TestValidateFastPath makes sure the requests clients usually send do take
// the fast path (the equivalence tests would pass without one), and pins
// their fingerprints.
func TestValidateFastPath(t *testing.T) {
	for body, want := range map[string]string{
		`{"amountCents":2599,"currency":"USD","reference":"order-1001"}`:                                `{"amountCents":2599,"currency":"USD","reference":"order-1001"}`,
		"{\n  \"reference\": \" order-1001 \",\n  \"currency\": \"usd\",\n  \"amountCents\": 2599\n}\n": `{"amountCents":2599,"currency":"USD","reference":"order-1001"}`,
		`{"amountCents":1000000000000000,"currency":"eUr","reference":"x"}`:                             `{"amountCents":1000000000000000,"currency":"EUR","reference":"x"}`,
		`{"amountCents":1,"currency":"GBP","reference":"A\u0026B \u003c\u003e \"q\" \\ \/"}`:            `{"amountCents":1,"currency":"GBP","reference":"A\u0026B \u003c\u003e \"q\" \\ /"}`,
		`{"amountCents":1,"currency":"GBP","reference":"<&>` + "\u2028x\u2029" + `."}`:                  `{"amountCents":1,"currency":"GBP","reference":"\u003c\u0026\u003e\u2028x\u2029."}`,
		`{"amountCents":1,"currency":"CHF","reference":"café \ud83d\ude00 ` + "\U0001F600" + `"}`:       "{\"amountCents\":1,\"currency\":\"CHF\",\"reference\":\"café \U0001F600 \U0001F600\"}",
		`{"amountCents":5,"currency":"chf","reference":"` + strings.Repeat("é", 100) + `"}`:             `{"amountCents":5,"currency":"CHF","reference":"` + strings.Repeat("é", 100) + `"}`,
		`{"amountCents":5,"currency":"chf","reference":"` + strings.Repeat(`\"`, 100) + `"}`:            `{"amountCents":5,"currency":"CHF","reference":"` + strings.Repeat(`\"`, 100) + `"}`,
		`{"amountCents":5,"currency":"\u0063hf","reference":"\u00a0x\u0085"}`:                           `{"amountCents":5,"currency":"CHF","reference":"x"}`,
	} {
		var scratch [128]byte
		if _, ok := parseFast([]byte(body), scratch[:0]); !ok {
			t.Errorf("%s does not take the fast path", body)
		}
		got, err := Fingerprint(nil, []byte(body))
		if err != nil || string(got) != want {
			t.Errorf("Fingerprint(%s) = %s, %v; want %s", body, got, err, want)
		}
		checkMatchesOld(t, nil, []byte(body))
	}
}

// TestAppendJSONString compares the fingerprint's string encoder with
// encoding/json's on strings that need every kind of escape.
func TestAppendJSONString(t *testing.T) {
	for _, s := range []string{
		"", "plain", "\"\\/", "<>&", "\u2028\u2029", "\u2027\u202a", "\x00\x01\x07\b\t\n\v\f\r\x0e\x1f\x20\x7f",
		"\x80", "\xff", "a\xffb", "\xed\xa0\x80", "\xc0\xaf", "\xe2\x80", "\xe2\x80\xa8\xe2", "é€\U0001F600",
		"\ufffd", "\U0010ffff", "\xf4\x90\x80\x80",
	} {
		checkJSONString(t, []byte(s))
	}
	var all []byte
	for b := 0; b < 256; b++ {
		all = append(all, byte(b))
	}
	checkJSONString(t, all)
}

// checkJSONString fails t unless appendJSONString writes s as
// json.Marshal does. Invalid UTF-8, which never reaches it (parseFast
// refuses it), is compared only with the default encoding/json, which
// writes \ufffd for it; the GOEXPERIMENT=jsonv2 one writes U+FFFD itself.
func checkJSONString(t *testing.T, s []byte) {
	t.Helper()
	if !utf8.Valid(s) {
		if v1, _ := json.Marshal("\xff"); string(v1) != `"\ufffd"` {
			return
		}
	}
	want, err := json.Marshal(string(s))
	if err != nil {
		t.Fatal(err)
	}
	if got := appendJSONString([]byte("prefix"), s); string(got) != "prefix"+string(want) {
		t.Fatalf("appendJSONString(%q) = %q; encoding/json %q", s, got[len("prefix"):], want)
	}
}
