package payments

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/bojanz/currency"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/canonjson"
)

// normalised is the validated, normalised request: what is fingerprinted,
// so that "usd" and "USD" (or surrounding spaces in the reference) are one
// request.
type normalised struct {
	AmountCents int64  `json:"amountCents"`
	Currency    string `json:"currency"`
	Reference   string `json:"reference"`
}

// Validate parses and validates a payment request. It returns the
// normalised request, or a 400 problem listing each invalid field. It is the
// middleware's FingerprintFunc, so it runs before the key is claimed: an
// invalid request does not consume its key.
//
// It runs on every POST, replays included, so the request as clients send
// it (a flat object of the three fields, the amount in plain digits) takes
// a fast path, parseFast, that allocates only the normalised strings. Every
// other body, and every invalid one, goes through validateStrict, which
// defines the answer: the fast path accepts only what validateStrict
// accepts, with the same normalised values.
func Validate(body []byte) (normalised, *idem.Problem) {
	var scratch [128]byte
	if f, ok := parseFast(body, scratch[:0]); ok {
		return f.normalised(), nil
	}
	return validateStrict(body)
}

// normalised returns f's values as strings, in one allocation.
func (f fastRequest) normalised() normalised {
	var b strings.Builder
	b.Grow(len(f.currency) + len(f.ref))
	b.Write(f.currency[:])
	b.Write(f.ref)
	s := b.String()
	return normalised{AmountCents: f.amount, Currency: s[:len(f.currency)], Reference: s[len(f.currency):]}
}

// fromPayload returns the request whose fingerprint payload (what
// Fingerprint returned, the middleware's idem.Info.Payload) is p, false if
// p is not one. The payload is the normalised request's JSON, which
// parseFast reads (normalising is idempotent: FuzzValidate), so the
// handler does not decode the request a second time with encoding/json,
// which cost a first payment 2 % of its CPU time in idem serve.
func fromPayload(p []byte) (normalised, bool) {
	var scratch [128]byte
	if f, ok := parseFast(p, scratch[:0]); ok {
		return f.normalised(), true
	}
	var n normalised
	return n, json.Unmarshal(p, &n) == nil
}

// validateStrict is Validate for any body: the strict canonicaliser first,
// then each field. Its problems are the answers to invalid requests.
func validateStrict(body []byte) (normalised, *idem.Problem) {
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
	f := checkFields(fields, errs)
	n := normalised(f)
	if len(errs) > 0 {
		return normalised{}, invalid(errs)
	}
	return n, nil
}

// Fields are a payment's amount, currency and reference, validated and
// normalised by the rules of the API.
type Fields struct {
	AmountCents int64
	Currency    string
	Reference   string
}

// ValidateFields checks the amountCents, currency and reference members
// of a JSON object by the rules a payment request must follow, and returns
// them normalised, or the problems of each invalid one (keyed by member
// name, as in the API's 400 answer). Other members are not looked at. It is
// how `idem consume` checks a payment.created event, so that what it books
// obeys the rules the API enforced.
func ValidateFields(fields map[string]json.RawMessage) (Fields, map[string][]string) {
	errs := map[string][]string{}
	f := checkFields(fields, errs)
	if len(errs) > 0 {
		return Fields{}, errs
	}
	return f, nil
}

// checkFields validates the three members of a payment into errs.
func checkFields(fields map[string]json.RawMessage, errs map[string][]string) Fields {
	var n Fields
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
	if c, ok, problem := stringField(fields, "currency"); !ok {
		errs["currency"] = append(errs["currency"], problem)
	} else {
		c = strings.ToUpper(strings.TrimSpace(c))
		switch {
		case len(c) != 3 || strings.Trim(c, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "":
			errs["currency"] = append(errs["currency"], "must be a 3-letter currency code such as USD")
		case !knownCurrency(c):
			errs["currency"] = append(errs["currency"], "is not an ISO 4217 currency code in use")
		}
		n.Currency = c
	}
	if ref, ok, problem := stringField(fields, "reference"); !ok {
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
	return n
}

// knownCurrency reports whether c (three upper-case letters) is an ISO
// 4217 code of a currency in use (CLDR's list, through
// github.com/bojanz/currency): a payment in "ZZZ", or in the "no
// currency" code XXX, is refused.
func knownCurrency(c string) bool {
	return c != "" && currency.IsValid(c)
}

// stringField returns the string member name of fields, or why it is not
// one.
func stringField(fields map[string]json.RawMessage, name string) (string, bool, string) {
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

func invalid(errs map[string][]string) *idem.Problem {
	return &idem.Problem{
		Type:       "https://github.com/idemhq/idem/blob/main/docs/payments.md#validation",
		Status:     http.StatusBadRequest,
		Code:       "payment.invalid",
		Title:      "The payment request is invalid",
		Detail:     "One or more fields are invalid; see errors.",
		Extensions: map[string]any{"errors": errs},
	}
}
