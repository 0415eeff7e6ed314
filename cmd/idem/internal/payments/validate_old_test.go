package payments

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/canonjson"
)

// validateOld, stringFieldOld and fingerprintOld are a frozen copy of
// Validate, stringField and Fingerprint as they were before the fast path:
// the reference the equivalence tests and the fuzz target compare the
// current implementation with. Do not change them, except to add a rule
// the API gains (the known currency code).

func validateOld(body []byte) (normalised, *idem.Problem) {
	// The strict JSON rules of the core (valid UTF-8, no duplicate member
	// names) apply here too: this hook replaces its fingerprint.
	if _, err := canonjson.Append(nil, body); err != nil {
		if len(strings.TrimSpace(string(body))) == 0 {
			return normalised{}, invalid(map[string][]string{"body": {"is empty; send a JSON object"}})
		}
		return normalised{}, invalid(map[string][]string{"body": {strings.TrimPrefix(err.Error(), "idem: ")}})
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return normalised{}, invalid(map[string][]string{"body": {"must be a JSON object"}})
	}
	errs := map[string][]string{}
	for name := range fields {
		if name != "amountCents" && name != "currency" && name != "reference" {
			errs[name] = append(errs[name], "is not a field of a payment")
		}
	}
	var n normalised
	if raw, ok := fields["amountCents"]; !ok {
		errs["amountCents"] = append(errs["amountCents"], "is required")
	} else {
		// Any spelling of a whole number is accepted (2599, 2599.0,
		// 2.599e3), as the fingerprint treats them as one value: its
		// canonical form is then plain digits.
		canon, _ := canonjson.Append(nil, raw)
		amount, err := strconv.ParseInt(string(canon), 10, 64)
		isNumber := len(canon) > 0 && (canon[0] == '-' || (canon[0] >= '0' && canon[0] <= '9'))
		switch {
		case !isNumber || strings.ContainsAny(string(canon), ".e"):
			errs["amountCents"] = append(errs["amountCents"], "must be a whole number of cents")
		case err != nil && canon[0] != '-':
			errs["amountCents"] = append(errs["amountCents"], "must be at most 1000000000000000")
		case amount <= 0:
			errs["amountCents"] = append(errs["amountCents"], "must be greater than 0")
		case amount > 1e15:
			errs["amountCents"] = append(errs["amountCents"], "must be at most 1000000000000000")
		default:
			n.AmountCents = amount
		}
	}
	if c, ok, problem := stringFieldOld(fields, "currency"); !ok {
		errs["currency"] = append(errs["currency"], problem)
	} else {
		c = strings.ToUpper(strings.TrimSpace(c))
		if len(c) != 3 || strings.Trim(c, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
			errs["currency"] = append(errs["currency"], "must be a 3-letter currency code such as USD")
		} else if !knownCurrency(c) {
			// The one rule added since the copy was frozen: a known
			// ISO 4217 code.
			errs["currency"] = append(errs["currency"], "is not an ISO 4217 currency code in use")
		}
		n.Currency = c
	}
	if ref, ok, problem := stringFieldOld(fields, "reference"); !ok {
		errs["reference"] = append(errs["reference"], problem)
	} else {
		ref = strings.TrimSpace(ref)
		switch {
		case ref == "":
			errs["reference"] = append(errs["reference"], "must not be empty")
		case utf8.RuneCountInString(ref) > 100:
			errs["reference"] = append(errs["reference"], "must be at most 100 characters")
		case strings.ContainsFunc(ref, unicode.IsControl):
			// NUL cannot be stored in PostgreSQL text, and no control
			// character belongs in a reference: refused on every store.
			errs["reference"] = append(errs["reference"], "must not contain control characters")
		}
		n.Reference = ref
	}
	if len(errs) > 0 {
		return normalised{}, invalid(errs)
	}
	return n, nil
}

func stringFieldOld(fields map[string]json.RawMessage, name string) (string, bool, string) {
	raw, ok := fields[name]
	if !ok {
		return "", false, "is required"
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", false, "must be a string"
	}
	return s, true, ""
}

func fingerprintOld(r *http.Request, body []byte) ([]byte, error) {
	if r != nil {
		if p := CheckContentType(r); p != nil {
			return nil, p
		}
	}
	n, p := validateOld(body)
	if p != nil {
		return nil, p
	}
	return json.Marshal(n)
}
