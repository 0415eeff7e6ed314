package payments

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	ok := map[string]normalised{
		`{"amountCents":2599,"currency":"usd","reference":"order-1001"}`:                    {2599, "USD", "order-1001"},
		`{"reference":"  spaced  ","currency":" Eur ","amountCents":1}`:                     {1, "EUR", "spaced"},
		`{"amountCents":1e3,"currency":"GBP","reference":"x"}`:                              {1000, "GBP", "x"},
		`{"amountCents":5,"currency":"chf","reference":"` + strings.Repeat("é", 100) + `"}`: {5, "CHF", strings.Repeat("é", 100)},
	}
	for body, want := range ok {
		got, p := Validate([]byte(body))
		if p != nil || got != want {
			t.Errorf("Validate(%s) = %+v, %v; want %+v", body, got, p, want)
		}
	}
	bad := map[string][]string{
		`{"amountCents":-1,"currency":"dollars","reference":""}`:     {"amountCents", "currency", "reference"},
		`{"amountCents":0,"currency":"US1","reference":"x"}`:         {"amountCents", "currency"},
		`{"amountCents":25.5,"currency":"USD","reference":"x"}`:      {"amountCents"},
		`{"amountCents":"2599","currency":"USD","reference":"x"}`:    {"amountCents"},
		`{"amountCents":1,"currency":840,"reference":"x"}`:           {"currency"},
		`{"amountCents":1,"currency":"ZZZ","reference":"x"}`:         {"currency"},
		`{"amountCents":1,"currency":"xxx","reference":"x"}`:         {"currency"},
		`{"amountCents":1,"currency":"USD","reference":"x","tip":2}`: {"tip"},
		`{"currency":"USD"}`: {"amountCents", "reference"},
		`{"amountCents":1,"currency":"USD","reference":"` + strings.Repeat("r", 101) + `"}`: {"reference"},
		`{"amountCents":1,"amountCents":2,"currency":"USD","reference":"x"}`:                {"body"},
		`[1,2]`: {"body"},
		`null`:  {"body"},
		``:      {"body"},
		`{"a":`: {"body"},
	}
	for body, fields := range bad {
		_, p := Validate([]byte(body))
		if p == nil || p.Status != http.StatusBadRequest {
			t.Errorf("Validate(%s) accepted", body)
			continue
		}
		errs := p.Extensions["errors"].(map[string][]string)
		if len(errs) != len(fields) {
			t.Errorf("Validate(%s) errors %v, want exactly %v", body, errs, fields)
		}
		for _, f := range fields {
			if len(errs[f]) == 0 {
				t.Errorf("Validate(%s) errors %v, missing %s", body, errs, f)
			}
		}
	}
}

func TestFingerprintNormalises(t *testing.T) {
	a, err1 := Fingerprint(nil, []byte(`{"amountCents":2599,"currency":"usd","reference":"order-1001"}`))
	b, err2 := Fingerprint(nil, []byte(`{"reference":"order-1001 ","currency":"USD","amountCents":2599.0}`))
	if err1 != nil || err2 != nil || string(a) != string(b) {
		t.Fatalf("normalised payloads differ: %s / %s (%v %v)", a, b, err1, err2)
	}
	var n normalised
	if err := json.Unmarshal(a, &n); err != nil || n.Currency != "USD" {
		t.Fatalf("payload %s", a)
	}
}

func TestTenant(t *testing.T) {
	r, _ := http.NewRequest("POST", "/", nil)
	if ten, err := Tenant(r); err != nil || ten != "anonymous" {
		t.Fatalf("no header: %q %v", ten, err)
	}
	r.Header.Set("Authorization", "Bearer secret-token")
	ten, err := Tenant(r)
	if err != nil || strings.Contains(ten, "secret") || !strings.HasPrefix(ten, "t_") {
		t.Fatalf("bearer tenant %q %v: must be a hash, never the token", ten, err)
	}
	r.Header.Set("Authorization", "bearer secret-token")
	if again, _ := Tenant(r); again != ten {
		t.Fatal("scheme is case-insensitive")
	}
	for _, h := range []string{"Basic abc", "Bearer", "Bearer   ", "token"} {
		r.Header.Set("Authorization", h)
		if _, err := Tenant(r); err == nil {
			t.Errorf("Authorization %q accepted", h)
		}
	}
}

// ValidTenant and ValidPaymentID accept what Tenant and newID make, and
// nothing else of that shape.
func TestValidTenantAndPaymentID(t *testing.T) {
	r, _ := http.NewRequest("POST", "/", nil)
	for _, auth := range []string{"", "Bearer a", "Bearer " + strings.Repeat("x", 500)} {
		r.Header.Set("Authorization", auth)
		ten, err := Tenant(r)
		if err != nil || !ValidTenant(ten) {
			t.Errorf("Tenant for %q = %q (%v): not ValidTenant", auth, ten, err)
		}
	}
	for range 100 {
		if id := newID(); !ValidPaymentID(id) {
			t.Fatalf("newID() = %q: not ValidPaymentID", id)
		}
	}
	for _, s := range []string{"", "t_", "t_0123456789abcdef0123456", "t_0123456789abcdef012345678", "t_0123456789ABCDEF01234567",
		"T_0123456789abcdef01234567", "anonymous ", "Anonymous", "t_0123456789abcdef0123456\x00"} {
		if ValidTenant(s) {
			t.Errorf("ValidTenant(%q)", s)
		}
	}
	for _, s := range []string{"", "pay_", "pay_abcdefghijklmnopqrstuvwxy", "pay_abcdefghijklmnopqrstuvwxyz2", "pay_ABCDEFGHIJKLMNOPQRSTUVWXYZ",
		"pay_abcdefghijklmnopqrstuvwx01", "PAY_abcdefghijklmnopqrstuvwxyz", "pay_abcdefghijklmnopqrstuvwxy\n"} {
		if ValidPaymentID(s) {
			t.Errorf("ValidPaymentID(%q)", s)
		}
	}
}

// ValidateFields applies the request's rules to the three members and
// ignores the others.
func TestValidateFields(t *testing.T) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal([]byte(`{"amountCents":100,"currency":" eur","reference":"r ","tenant":"x"}`), &fields); err != nil {
		t.Fatal(err)
	}
	f, errs := ValidateFields(fields)
	if errs != nil || f != (Fields{100, "EUR", "r"}) {
		t.Fatalf("ValidateFields = %+v, %v", f, errs)
	}
	if err := json.Unmarshal([]byte(`{"amountCents":-5,"currency":"QQQ","reference":"a\u0007b"}`), &fields); err != nil {
		t.Fatal(err)
	}
	f, errs = ValidateFields(fields)
	if len(errs) != 3 || f != (Fields{}) {
		t.Fatalf("ValidateFields = %+v, %v; want three problems", f, errs)
	}
}
