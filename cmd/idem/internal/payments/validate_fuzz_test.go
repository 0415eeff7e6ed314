package payments

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// FuzzValidate feeds arbitrary bodies to the payment parser: it never
// panics; whatever it accepts obeys the documented rules; normalising is
// idempotent (the normalised request validates to itself), so one payment
// has one fingerprint whatever its spelling.
func FuzzValidate(f *testing.F) {
	for _, s := range []string{
		`{"amountCents":2599,"currency":"USD","reference":"order-1001"}`,
		`{"reference":" order ","currency":"usd","amountCents":2.599e3}`,
		`{"amountCents":0,"currency":"US","reference":""}`,
		`{"amountCents":1,"currency":"EUR","reference":"a","extra":1}`,
		`{"amountCents":1,"amountCents":2,"currency":"EUR","reference":"a"}`,
		`[]`, `null`, ``, `{"amountCents":1e400,"currency":"EUR","reference":"a"}`,
		"{\"amountCents\":1,\"currency\":\"EUR\",\"reference\":\"\xff\"}",
		`{"amountCents":1,"currency":"EUR","reference":"a\u0000b"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		n, problem := Validate(body)
		if problem != nil {
			if problem.Status != 400 || problem.Code != "payment.invalid" {
				t.Fatalf("Validate(%q): problem %d %s", body, problem.Status, problem.Code)
			}
			if _, err := Fingerprint(nil, body); err == nil {
				t.Fatalf("Fingerprint accepted %q, which Validate refuses", body)
			}
			return
		}
		if n.AmountCents <= 0 || n.AmountCents > 1e15 {
			t.Fatalf("Validate(%q) accepted amountCents %d", body, n.AmountCents)
		}
		if len(n.Currency) != 3 || strings.Trim(n.Currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" || !knownCurrency(n.Currency) {
			t.Fatalf("Validate(%q) accepted currency %q", body, n.Currency)
		}
		if n.Reference == "" || n.Reference != strings.TrimSpace(n.Reference) || utf8.RuneCountInString(n.Reference) > 100 || !utf8.ValidString(n.Reference) ||
			strings.ContainsFunc(n.Reference, unicode.IsControl) {
			t.Fatalf("Validate(%q) accepted reference %q", body, n.Reference)
		}
		again, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		n2, problem := Validate(again)
		if problem != nil || n2 != n {
			t.Fatalf("the normalised %s validates to %+v (%v), not itself", again, n2, problem)
		}
		fp1, err1 := Fingerprint(nil, body)
		if n3, ok := fromPayload(fp1); err1 == nil && (!ok || n3 != n) {
			t.Fatalf("the fingerprint payload %s reads as %+v (%v), not %+v", fp1, n3, ok, n)
		}
		fp2, err2 := Fingerprint(nil, again)
		if err1 != nil || err2 != nil || !bytes.Equal(fp1, fp2) {
			t.Fatalf("the fingerprints of %q and its normalised form differ: %s / %s (%v, %v)", body, fp1, fp2, err1, err2)
		}
	})
}

// FuzzValidateMatchesOld checks that Validate and Fingerprint, with their
// fast path, answer every body exactly as the old implementation
// (validateOld, fingerprintOld) does: the same normalised request, the
// same problem, byte-identical fingerprints, which stored requests are
// compared with.
func FuzzValidateMatchesOld(f *testing.F) {
	for _, body := range equivBodies {
		f.Add([]byte(body))
	}
	typical := func(a, c, r string) string {
		return `{"amountCents":` + a + `,"currency":` + c + `,"reference":` + r + `}`
	}
	for _, a := range equivAmounts {
		f.Add([]byte(typical(a, `"USD"`, `"order-1001"`)))
	}
	for _, c := range equivCurrencies {
		f.Add([]byte(typical(`2599`, c, `"order-1001"`)))
	}
	for _, r := range equivReferences {
		f.Add([]byte(typical(`2599`, `"usd"`, r)))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkMatchesOld(t, nil, body)
	})
}

// FuzzAppendJSONString checks the fingerprint's string encoder against
// encoding/json's on any bytes.
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"order-1001", "<a&b>", "\u2028\u2029", "\x00\b\f\n\r\t\x1f\x7f", "\xff\xed\xa0\x80", "é\U0001F600"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, s []byte) {
		checkJSONString(t, s)
	})
}

// FuzzValidateFieldsMatchOld is FuzzValidateMatchesOld with the body built
// from the JSON texts of its three members, so that the fuzzer mutates
// values inside requests that are otherwise well formed: the fast path's
// ground.
func FuzzValidateFieldsMatchOld(f *testing.F) {
	for i, a := range equivAmounts {
		f.Add(a, equivCurrencies[i%len(equivCurrencies)], equivReferences[i%len(equivReferences)], i%2 == 0)
	}
	for i, r := range equivReferences {
		f.Add(equivAmounts[i%len(equivAmounts)], equivCurrencies[i%len(equivCurrencies)], r, i%2 == 0)
	}
	f.Fuzz(func(t *testing.T, amount, currency, reference string, reorder bool) {
		body := `{"amountCents":` + amount + `,"currency":` + currency + `,"reference":` + reference + `}`
		if reorder {
			body = "\n{ \"reference\" :\t" + reference + " ,\r\n \"currency\": " + currency + ",\"amountCents\" : " + amount + " }\n"
		}
		checkMatchesOld(t, nil, []byte(body))
	})
}
