package events

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/inbox"
)

const (
	testPayment = "pay_abcdefghijklmnopqrstuvwxyz"
	testTenant  = "t_0123456789abcdef01234567"
)

// validEvent is the payload idem serve publishes, with its fields
// overridden by over (a nil value deletes the field).
func validEvent(over map[string]any) []byte {
	e := map[string]any{"type": "payment.created", "paymentId": testPayment, "tenant": testTenant,
		"amountCents": 2599, "currency": "USD", "reference": "order-1001", "createdAt": "2026-12-01T10:00:00.123456Z"}
	for k, v := range over {
		if v == nil {
			delete(e, k)
		} else {
			e[k] = v
		}
	}
	b, err := json.Marshal(e)
	if err != nil {
		panic(err)
	}
	return b
}

func TestParsePaymentCreated(t *testing.T) {
	t.Parallel()
	id := MessageID(testPayment)
	// What Event publishes parses back to itself.
	at := time.Date(2026, 12, 1, 10, 0, 0, 123456000, time.UTC)
	m, err := Event(DefaultSubject, PaymentCreated{PaymentID: testPayment, Tenant: "anonymous", AmountCents: 1, Currency: "EUR", Reference: "r", CreatedAt: at})
	if err != nil {
		t.Fatal(err)
	}
	e, err := ParsePaymentCreated(m.ID, m.Payload)
	want := PaymentCreated{Type: TypePaymentCreated, PaymentID: testPayment, Tenant: "anonymous", AmountCents: 1, Currency: "EUR", Reference: "r", CreatedAt: at}
	if err != nil || e != want {
		t.Fatalf("ParsePaymentCreated(Event) = %+v, %v; want %+v", e, err, want)
	}
	// Accepted as the API accepts them: normalised; unknown members ignored.
	e, err = ParsePaymentCreated(id, validEvent(map[string]any{"currency": " chf", "reference": " r1 ", "amountCents": 2.599e3, "later": map[string]any{"x": 1}}))
	if err != nil || e.Currency != "CHF" || e.Reference != "r1" || e.AmountCents != 2599 {
		t.Fatalf("normalised: %+v, %v", e, err)
	}

	secret := "s3cr3t-card-4111111111111111"
	for name, tc := range map[string]struct {
		id      string
		payload []byte
		want    string // in the error
	}{
		"negative amount":      {id, validEvent(map[string]any{"amountCents": -100}), "amountCents must be greater than 0"},
		"zero amount":          {id, validEvent(map[string]any{"amountCents": 0}), "amountCents must be greater than 0"},
		"fractional amount":    {id, validEvent(map[string]any{"amountCents": 1.5}), "amountCents must be a whole number"},
		"amount over the max":  {id, validEvent(map[string]any{"amountCents": int64(1e15) + 1}), "amountCents must be at most"},
		"amount overflow":      {id, []byte(strings.Replace(string(validEvent(nil)), "2599", "99999999999999999999", 1)), "amountCents must be at most"},
		"amount as a string":   {id, validEvent(map[string]any{"amountCents": "2599"}), "amountCents must be a whole number"},
		"unknown currency":     {id, validEvent(map[string]any{"currency": "ZZZ"}), "currency is not an ISO 4217"},
		"no-currency code":     {id, validEvent(map[string]any{"currency": "XXX"}), "currency is not an ISO 4217"},
		"malformed currency":   {id, validEvent(map[string]any{"currency": "US$"}), "currency must be a 3-letter"},
		"control character":    {id, validEvent(map[string]any{"reference": "a\u001b]52;c;" + secret + "\u0007"}), "reference must not contain control characters"},
		"NUL":                  {id, validEvent(map[string]any{"reference": "a\u0000" + secret}), "reference must not contain control characters"},
		"invalid UTF-8":        {id, []byte(strings.Replace(string(validEvent(nil)), "order-1001", "order-\xff\xfe"+secret, 1)), "not valid UTF-8"},
		"oversized reference":  {id, validEvent(map[string]any{"reference": strings.Repeat("r", 101)}), "reference must be at most 100 characters"},
		"empty reference":      {id, validEvent(map[string]any{"reference": "  "}), "reference must not be empty"},
		"oversized payload":    {id, validEvent(map[string]any{"pad": strings.Repeat("x", MaxEventBytes)}), "more than 16384"},
		"oversized tenant":     {id, validEvent(map[string]any{"tenant": "t_" + strings.Repeat("a", 5000)}), "tenant must be"},
		"oversized payment id": {MessageID("pay_" + strings.Repeat("a", 300)), validEvent(map[string]any{"paymentId": "pay_" + strings.Repeat("a", 300)}), "paymentId must be"},
		"malformed JSON":       {id, []byte(`{"type":"payment.created",`), "not valid JSON"},
		"not an object":        {id, []byte(`[1,2,3]`), "not a JSON object"},
		"null":                 {id, []byte(`null`), "not a JSON object"},
		"empty":                {id, nil, "not valid JSON"},
		"duplicate member":     {id, []byte(strings.Replace(string(validEvent(nil)), `"amountCents":2599`, `"amountCents":1,"amountCents":2599`, 1)), "duplicate member name"},
		"wrong type":           {id, validEvent(map[string]any{"type": "payment.refunded"}), "type must be payment.created"},
		"missing field":        {id, validEvent(map[string]any{"tenant": nil}), "tenant is required"},
		"message id mismatch":  {"payment.created:pay_zzzzzzzzzzzzzzzzzzzzzzzzzz", validEvent(nil), "paymentId does not match the message id"},
		"bad time":             {id, validEvent(map[string]any{"createdAt": "yesterday"}), "createdAt must be an RFC 3339 time"},
	} {
		_, err := ParsePaymentCreated(tc.id, tc.payload)
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		if !errors.Is(err, ErrInvalidEvent) || !errors.Is(err, inbox.ErrUnprocessable) {
			t.Errorf("%s: %v does not wrap ErrInvalidEvent and inbox.ErrUnprocessable", name, err)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want it to say %q", name, err, tc.want)
		}
		if strings.Contains(err.Error(), secret) || len(err.Error()) > 400 {
			t.Errorf("%s: the error quotes the payload: %.500q", name, err)
		}
	}
}

// FuzzParsePaymentCreated: the parser never panics; what it accepts obeys
// the API's rules and is published unchanged by Event; what it refuses
// wraps ErrInvalidEvent with a bounded message.
func FuzzParsePaymentCreated(f *testing.F) {
	f.Add(MessageID(testPayment), validEvent(nil))
	f.Add(MessageID(testPayment), validEvent(map[string]any{"amountCents": -1, "currency": "ZZZ"}))
	f.Add(MessageID(testPayment), validEvent(map[string]any{"reference": "a\u0000b"}))
	f.Add("x", []byte(`{"a":1,"a":2}`))
	f.Add("", []byte("\xff"))
	f.Fuzz(func(t *testing.T, id string, payload []byte) {
		e, err := ParsePaymentCreated(id, payload)
		if err != nil {
			if !errors.Is(err, ErrInvalidEvent) || len(err.Error()) > 1000 {
				t.Fatalf("error %.2000q", err)
			}
			return
		}
		if id != MessageID(e.PaymentID) || e.AmountCents <= 0 || e.AmountCents > 1e15 || len(e.Currency) != 3 ||
			e.Reference == "" || e.Tenant == "" || e.CreatedAt.IsZero() {
			t.Fatalf("accepted %+v from %q", e, payload)
		}
		m, err := Event(DefaultSubject, e)
		if err != nil {
			t.Fatal(err)
		}
		again, err := ParsePaymentCreated(m.ID, m.Payload)
		e2 := again
		e2.CreatedAt = e.CreatedAt
		if err != nil || e2 != e || !again.CreatedAt.Equal(e.CreatedAt) {
			t.Fatalf("the accepted event %+v publishes as %s, which parses to %+v, %v", e, m.Payload, again, err)
		}
	})
}
