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
		if len(n.Currency) != 3 || strings.Trim(n.Currency, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
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
		fp2, err2 := Fingerprint(nil, again)
		if err1 != nil || err2 != nil || !bytes.Equal(fp1, fp2) {
			t.Fatalf("the fingerprints of %q and its normalised form differ: %s / %s (%v, %v)", body, fp1, fp2, err1, err2)
		}
	})
}
