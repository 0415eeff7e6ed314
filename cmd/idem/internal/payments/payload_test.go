package payments

import "testing"

// The handler reads the request back from its fingerprint payload: the
// same values Validate gave, for bodies of the fast path and of the
// strict one (escapes, spaces, a lower-case currency, an exponent), and
// nothing from what is not a payload.
func TestFromPayload(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"amountCents":2599,"currency":"USD","reference":"order-1001"}`,
		`{"reference":" a <b> & \"c\" ","currency":"usd","amountCents":2.599e3}`,
		`{"amountCents":1,"currency":"EUR","reference":"\u00e9t\u00e9 \u2028"}`,
	} {
		want, p := Validate([]byte(body))
		if p != nil {
			t.Fatalf("Validate(%s): %v", body, p)
		}
		fp, err := Fingerprint(nil, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := fromPayload(fp); !ok || got != want {
			t.Errorf("fromPayload(%s) = %+v, %v; want %+v", fp, got, ok, want)
		}
	}
	for _, p := range []string{``, `null x`, `{"amountCents":"1"}`} {
		if n, ok := fromPayload([]byte(p)); ok {
			t.Errorf("fromPayload(%q) = %+v, true", p, n)
		}
	}
}
