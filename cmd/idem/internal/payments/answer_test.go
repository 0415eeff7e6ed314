package payments

import (
	"net/http"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		status int
		body   string
		class  answerClass
		id     string
		code   string
		reason string
	}{
		{201, `{"id":"ch_1","amountCents":5}`, classCreated, "ch_1", "", ""},
		{201, `{"id":""}`, classUnexpected, "", "", ""},
		{201, `{"id":7}`, classUnexpected, "", "", ""},
		{201, ``, classUnexpected, "", "", ""},
		{200, `{"id":"ch_1"}`, classCreated, "ch_1", "", ""},
		{200, `{"status":"ok"}`, classUnexpected, "", "", ""},
		{202, `{"id":"ch_1"}`, classUnexpected, "", "", ""},
		{204, ``, classUnexpected, "", "", ""},
		{100, ``, classUnexpected, "", "", ""},
		{301, ``, classUnexpected, "", "", ""},
		{600, ``, classUnexpected, "", "", ""},
		{402, cardDeclined, classDeclined, "", "card_declined", "Insufficient funds."},
		{402, `{"code":"card_declined","title":"The card was declined"}`, classDeclined, "", "card_declined", "The card was declined"},
		{400, `{"message":"  bad \n\t request  "}`, classDeclined, "", "http_400", "bad request"},
		{403, `not json`, classDeclined, "", "http_403", "Forbidden"},
		{451, `{"code":"a b","detail":7}`, classDeclined, "", "http_451", "Unavailable For Legal Reasons"},
		{499, ``, classDeclined, "", "http_499", "refused with status 499"},
		{422, `{"code":"` + strings.Repeat("x", 65) + `"}`, classDeclined, "", "http_422", "Unprocessable Entity"},
		{408, ``, classRetryable, "", "", ""},
		{409, ``, classRetryable, "", "", ""},
		{425, ``, classRetryable, "", "", ""},
		{429, ``, classRetryable, "", "", ""},
		{500, ``, classRetryable, "", "", ""},
		{599, ``, classRetryable, "", "", ""},
	} {
		class, id, refusal, _ := classify(c.status, []byte(c.body))
		if class != c.class || id != c.id {
			t.Errorf("classify(%d, %q) = %v %q, want %v %q", c.status, c.body, class, id, c.class, c.id)
			continue
		}
		if (refusal != nil) != (class == classDeclined) {
			t.Errorf("classify(%d, %q): refusal %v with class %v", c.status, c.body, refusal, class)
			continue
		}
		if refusal != nil && (refusal.Status != c.status || refusal.Code != c.code || refusal.Reason != c.reason) {
			t.Errorf("classify(%d, %q) refusal = %+v, want code %q reason %q", c.status, c.body, refusal, c.code, c.reason)
		}
	}
	if got := printable(strings.Repeat("é", 300), maxReason); utf8.RuneCountInString(got) != maxReason {
		t.Errorf("printable kept %d characters, want %d", utf8.RuneCountInString(got), maxReason)
	}
}

// FuzzProviderAnswer: whatever a provider answers, the class follows from
// the status alone except for 201 and 200, a refusal's code is a short token and
// its reason short printable text, and a charge id is never empty.
func FuzzProviderAnswer(f *testing.F) {
	f.Add(201, []byte(`{"id":"ch_1"}`))
	f.Add(402, []byte(cardDeclined))
	f.Add(400, []byte(`{"code":"x\u001b]52;c;aGk=\u0007","detail":"\u202e\u0000bad"}`))
	f.Add(503, []byte(`{}`))
	f.Add(200, []byte(`{"id":"ch_1"}`))
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		class, id, refusal, desc := classify(status, body)
		switch {
		case status == http.StatusCreated, status == http.StatusOK:
			if (class == classCreated) != (id != "") || (class != classCreated && class != classUnexpected) {
				t.Fatalf("%d: class %v id %q", status, class, id)
			}
		case status == 408 || status == 409 || status == 425 || status == 429 || status >= 500 && status <= 599:
			if class != classRetryable {
				t.Fatalf("%d: class %v, want retryable", status, class)
			}
		case status >= 400 && status <= 499:
			if class != classDeclined || refusal == nil {
				t.Fatalf("%d: class %v, want declined", status, class)
			}
		default:
			if class != classUnexpected || desc == "" {
				t.Fatalf("%d: class %v, want unexpected", status, class)
			}
		}
		if refusal == nil {
			return
		}
		if !isToken(refusal.Code) {
			t.Fatalf("code %q is not a token", refusal.Code)
		}
		if refusal.Reason == "" || utf8.RuneCountInString(refusal.Reason) > maxReason || !utf8.ValidString(refusal.Reason) ||
			strings.ContainsFunc(refusal.Reason, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) {
			t.Fatalf("reason %q is not short printable text", refusal.Reason)
		}
	})
}
