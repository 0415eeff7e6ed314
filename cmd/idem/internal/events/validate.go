package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/idemhq/idem/canonjson"
	"github.com/idemhq/idem/cmd/idem/internal/payments"
	"github.com/idemhq/idem/inbox"
)

// MaxEventBytes bounds the payload of a payment.created event that `idem
// consume` books. An event idem serve publishes is well under 1 KiB (a
// reference is at most 100 characters); the bound is the API's request
// limit, payments.MaxBody.
const MaxEventBytes = payments.MaxBody

// ErrInvalidEvent is matched (errors.Is) by every error of
// ParsePaymentCreated, and so is inbox.ErrUnprocessable: a refused event
// is dropped (terminated or rejected at the broker), never redelivered and
// never booked.
var ErrInvalidEvent = errors.New("events: invalid payment.created event")

// invalidEventError says why an event was refused.
type invalidEventError struct{ why string }

func (e *invalidEventError) Error() string { return ErrInvalidEvent.Error() + ": " + e.why }

// Is matches ErrInvalidEvent and inbox.ErrUnprocessable.
func (e *invalidEventError) Is(target error) bool {
	return target == ErrInvalidEvent || target == inbox.ErrUnprocessable
}

// ParsePaymentCreated parses and validates the payload of a
// payment.created event delivered with message id id, by the rules of the
// payments API: the amount, currency and reference as a payment request
// must have them (payments.ValidateFields; the values are normalised the
// same way), a payment id and a tenant as the API makes them, a creation
// time, and the message id the event of that payment has
// (MessageID(paymentId)), so that one payment cannot be booked twice under
// two ids. The payload must be valid JSON under the core's strict rules
// (valid UTF-8, no duplicate member names), an object, and at most
// MaxEventBytes. Members it does not know are ignored, so that a newer
// producer may add some.
//
// Its errors wrap ErrInvalidEvent and list what is wrong by member name
// and rule. They never quote the payload, so that they can be logged.
func ParsePaymentCreated(id string, payload []byte) (PaymentCreated, error) {
	refuse := func(format string, args ...any) (PaymentCreated, error) {
		return PaymentCreated{}, &invalidEventError{why: fmt.Sprintf(format, args...)}
	}
	if len(payload) > MaxEventBytes {
		return refuse("the payload is %d bytes, more than %d", len(payload), MaxEventBytes)
	}
	if _, err := canonjson.Append(nil, payload); err != nil {
		why := strings.TrimPrefix(err.Error(), "idem: ")
		if len(why) > 120 { // a duplicate member name is quoted: bound it
			why = strings.ToValidUTF8(why[:120], "") + "..."
		}
		return refuse("the payload is not valid JSON: %s", why)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(payload, &fields); err != nil || fields == nil {
		return refuse("the payload is not a JSON object")
	}
	problems := map[string][]string{}
	add := func(name, problem string) { problems[name] = append(problems[name], problem) }
	var e PaymentCreated
	str := func(name string) (string, bool) {
		raw, ok := fields[name]
		if !ok {
			add(name, "is required")
			return "", false
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			add(name, "must be a string")
			return "", false
		}
		return s, true
	}
	if t, ok := str("type"); ok && t != TypePaymentCreated {
		add("type", "must be "+TypePaymentCreated)
	}
	if p, ok := str("paymentId"); ok {
		switch {
		case !payments.ValidPaymentID(p):
			add("paymentId", "must be a payment id such as pay_ followed by 26 characters of a-z and 2-7")
		case id != MessageID(p):
			add("paymentId", "does not match the message id (the event of a payment has the id "+TypePaymentCreated+":<paymentId>)")
		default:
			e.PaymentID = p
		}
	}
	if ten, ok := str("tenant"); ok {
		if !payments.ValidTenant(ten) {
			add("tenant", "must be anonymous or t_ followed by 24 hexadecimal digits")
		}
		e.Tenant = ten
	}
	if c, ok := str("createdAt"); ok {
		at, err := time.Parse(time.RFC3339Nano, c)
		if err != nil || at.IsZero() {
			add("createdAt", "must be an RFC 3339 time")
		}
		e.CreatedAt = at
	}
	f, errs := payments.ValidateFields(fields)
	for name, ps := range errs {
		problems[name] = append(problems[name], ps...)
	}
	if len(problems) > 0 {
		return refuse("%s", describe(problems))
	}
	e.Type, e.AmountCents, e.Currency, e.Reference = TypePaymentCreated, f.AmountCents, f.Currency, f.Reference
	return e, nil
}

// describe lists problems by member name, in name order: "amountCents
// must be greater than 0; currency is required".
func describe(problems map[string][]string) string {
	names := make([]string, 0, len(problems))
	for name := range problems {
		names = append(names, name)
	}
	sort.Strings(names)
	var parts []string
	for _, name := range names {
		for _, p := range problems[name] {
			parts = append(parts, name+" "+p)
		}
	}
	return strings.Join(parts, "; ")
}
