package payments

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// How the provider step reads the provider's answers. The provider's
// contract (idem provider's, and the one docs/payments.md states) is: 201
// with {"id":"ch_..."} for a charge made (or replayed for the same key), a
// 4xx for a charge refused, and the Idempotency-Key semantics for
// everything else. Every answer falls in one of four classes:
//
//   - created: 201, or 200, with a non-empty string "id". The charge
//     exists; the payment is captured with that id. 200 is accepted
//     because many providers answer a create (or its idempotent replay)
//     with it, and the charge id is what proves the charge.
//   - declined: a 4xx other than 408, 409, 425 and 429. The provider
//     refused the charge, and refuses it again for the same key: the
//     outcome is final. Nothing was charged; the payment fails with the
//     provider's reason, and the client gets 402 payment.declined, stored
//     and replayed to every retry.
//   - retryable: 408, 409, 425, 429, a 5xx, or no connection at all. The
//     charge may or may not have been made (a 5xx can follow a charge):
//     it is sent again with the same key, which the provider deduplicates.
//   - unexpected: any other answer: a 2xx other than 200 and 201 (202
//     Accepted says the charge is not made yet), a 200 or 201 without a
//     charge id or with a body that is not JSON, a 1xx or 3xx. The
//     provider may have charged, and nothing proves that it did: marking
//     the payment failed could leave a customer charged for a failed
//     payment, and capturing it without a charge id would claim money
//     nobody can trace. The outcome is unknown: the step is recorded as
//     such and resumed with the same key, and a provider that keeps
//     answering so leaves the payment to an operator
//     (--reconcile-max-attempts, --reconcile-max-age).
//
// An answer lost after the request was sent (a timeout, a connection
// closed without a response) is unknown too, and is retried with the same
// key.

// Answer labels: what one provider attempt's answer meant
// (ChargeObserver.ChargeAttempt).
const (
	// AnswerCreated: 201 or 200 with a charge id.
	AnswerCreated = "created"
	// AnswerDeclined: a final refusal (a 4xx other than 408, 409, 425, 429).
	AnswerDeclined = "declined"
	// AnswerRetryable: 408, 409, 425, 429 or a 5xx.
	AnswerRetryable = "retryable"
	// AnswerUnexpected: an answer outside the provider's contract.
	AnswerUnexpected = "unexpected"
	// AnswerRefused: no connection; nothing was sent.
	AnswerRefused = "refused"
	// AnswerLost: no answer after the request was (maybe) sent.
	AnswerLost = "lost"
)

// answerClass is what the provider step does with an answer.
type answerClass int

const (
	classCreated answerClass = iota + 1
	classDeclined
	classRetryable
	classUnexpected
	// classLost: an answer cut off before its end, as good as none.
	classLost
)

// classify reads the status and body of one provider answer: the charge
// id for classCreated, the provider's refusal for classDeclined, and for
// the other classes a short description of the answer.
func classify(status int, body []byte) (class answerClass, chargeID string, refusal *DeclineError, desc string) {
	switch {
	case status == http.StatusCreated, status == http.StatusOK:
		var c struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(body, &c); err != nil || c.ID == "" {
			return classUnexpected, "", nil, strconv.Itoa(status) + " without a charge id"
		}
		return classCreated, c.ID, nil, ""
	case status == http.StatusRequestTimeout, status == http.StatusConflict, status == http.StatusTooEarly,
		status == http.StatusTooManyRequests, status >= 500 && status <= 599:
		return classRetryable, "", nil, strconv.Itoa(status)
	case status >= 400 && status <= 499:
		return classDeclined, "", refusalOf(status, body), ""
	}
	return classUnexpected, "", nil, fmt.Sprintf("%d instead of 201 or 200", status)
}

// label is the answer label of a class.
func (c answerClass) label() string {
	switch c {
	case classCreated:
		return AnswerCreated
	case classDeclined:
		return AnswerDeclined
	case classRetryable:
		return AnswerRetryable
	case classLost:
		return AnswerLost
	}
	return AnswerUnexpected
}

// DeclineError is a provider's final refusal of a charge: the provider
// step ends with it, and the payment fails.
type DeclineError struct {
	// Status is the provider's HTTP status (402, 400, ...).
	Status int
	// Code is the provider's problem code (such as card_declined), or
	// http_STATUS when it gave none.
	Code string
	// Reason is the provider's explanation, at most maxReason characters
	// of printable text.
	Reason string
}

func (e *DeclineError) Error() string {
	return fmt.Sprintf("provider declined the charge: %d %s: %s", e.Status, e.Code, e.Reason)
}

// Bounds on what a refusal keeps of the provider's answer: it is stored
// with the payment and shown to the client.
const (
	maxCode   = 64
	maxReason = 200
)

// refusalOf reads the provider's code and reason from a refusal's body: a
// JSON object with "code" and "detail", "title" or "message" (problem+json
// and most providers' error bodies). What is missing or unusable falls
// back to the status.
func refusalOf(status int, body []byte) *DeclineError {
	var b struct {
		Code    any `json:"code"`
		Detail  any `json:"detail"`
		Title   any `json:"title"`
		Message any `json:"message"`
	}
	_ = json.Unmarshal(body, &b) // anything but an object leaves the fallbacks
	e := &DeclineError{Status: status, Code: "http_" + strconv.Itoa(status), Reason: http.StatusText(status)}
	if c, ok := b.Code.(string); ok && isToken(c) {
		e.Code = c
	}
	for _, v := range []any{b.Detail, b.Title, b.Message} {
		if s, ok := v.(string); ok {
			if s = printable(s, maxReason); s != "" {
				e.Reason = s
				break
			}
		}
	}
	if e.Reason == "" {
		e.Reason = "refused with status " + strconv.Itoa(status)
	}
	return e
}

// isToken reports whether s is a short code of letters, digits, '_', '.'
// and '-'.
func isToken(s string) bool {
	if s == "" || len(s) > maxCode {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r == '.' || r == '-' || r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r))) {
			return false
		}
	}
	return true
}

// printable returns s with control and other non-printing characters
// replaced by spaces, runs of spaces collapsed, trimmed, and cut to at
// most n characters.
func printable(s string, n int) string {
	var b strings.Builder
	space, count := false, 0
	for _, r := range s {
		if count == n {
			break
		}
		if r == utf8.RuneError || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			space = b.Len() > 0
			continue
		}
		if space {
			b.WriteByte(' ')
			count++
			space = false
			if count == n {
				break
			}
		}
		b.WriteRune(r)
		count++
	}
	return b.String()
}
