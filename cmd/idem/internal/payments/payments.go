// Package payments is the demo service behind `idem serve`: a small,
// retry-safe payments API whose POST is protected by the idem middleware.
//
// Payments live in the same database as the idempotency records when the
// records store is transactional (SQLite, PostgreSQL): the payment row and
// the stored response then commit in one transaction. With records kept
// elsewhere (Redis), each payment row carries the tenant and idempotency key
// under a unique constraint, so that even a re-execution after a crash (the
// lease-and-fencing guarantee's one gap) returns the existing payment
// instead of creating a second one.
package payments

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/bojanz/currency"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/canonjson"
)

// Payment is a stored payment.
type Payment struct {
	ID          string    `json:"id"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
	Reference   string    `json:"reference"`
	CreatedAt   time.Time `json:"createdAt"`

	tenant, key string
}

// ErrNotFound is returned by Repo.Get for an unknown payment, or another
// tenant's.
var ErrNotFound = errors.New("payments: not found")

// Repo stores payments. Insert runs inside the idempotent execution whose
// context it receives: on a transactional records store it writes through
// the execution's transaction.
type Repo interface {
	// Migrate creates the payments table.
	Migrate(ctx context.Context) error
	// Insert stores p, or returns the payment already stored for the same
	// tenant and idempotency key.
	Insert(ctx context.Context, p Payment) (Payment, error)
	// Get returns the tenant's payment id.
	Get(ctx context.Context, tenant, id string) (Payment, error)
	// Count returns the number of payments of all tenants.
	Count(ctx context.Context) (int64, error)
}

// RejectedError is returned by Repo.Insert when the database refuses the
// payment's data as invalid (a constraint or a value it cannot store), as
// opposed to being unavailable: the request is answered 422 and that
// answer is stored, since a retry would be refused the same way.
type RejectedError struct {
	// Reason says what was refused, without the data itself.
	Reason string
	Err    error
}

func (e *RejectedError) Error() string {
	return "payments: rejected: " + e.Reason + ": " + e.Err.Error()
}

func (e *RejectedError) Unwrap() error { return e.Err }

// Service serves the payments API.
type Service struct {
	Repo Repo
	// OpDelay makes the payment operation wait before it writes and
	// commits, to make the in-flight window visible.
	OpDelay time.Duration
	// NowFunc is the clock for createdAt. Defaults to time.Now.
	NowFunc func() time.Time
	// OnCreateFunc, if set, runs after a payment is written, with the
	// same context: inside the idempotent execution, so that what it
	// writes (the payment.created event in the outbox) commits in the
	// payment's transaction, or not at all. An error fails the payment
	// (503) and rolls everything back.
	OnCreateFunc func(ctx context.Context, p Payment, tenant string) error
	// FailReference, if set, makes payments with this reference fail
	// (500) after their rows were written, so that demos and tests can
	// show that a failed payment leaves nothing behind: no payment, no
	// event, and the key free for a retry.
	FailReference string
	// Logger receives the cause of every 5xx answer (see logFailure).
	// Defaults to slog.Default().
	Logger *slog.Logger
}

// logFailure logs why a request is answered with a 5xx status: the
// answer itself names no cause (a client must not read the database's
// errors), so the log is where an operator finds it. The idempotency key
// is logged redacted (idem.RedactKey), as the core logs it.
func logFailure(ctx context.Context, logger *slog.Logger, r *http.Request, status int, code string, err error) {
	if logger == nil {
		logger = slog.Default()
	}
	attrs := []slog.Attr{slog.String("method", r.Method), slog.String("path", r.URL.Path),
		slog.Int("status", status), slog.String("code", code), keyAttr(ctx), slog.Any("error", err)}
	logger.LogAttrs(ctx, slog.LevelError, "payments: answered "+strconv.Itoa(status)+" "+code, attrs...)
}

// DBTimeout bounds each call to the payments database, so that a database
// that stops answering turns into 503 payment.unavailable instead of a
// request that hangs for as long as its client waits.
const DBTimeout = 10 * time.Second

// MaxBody is the largest payment request accepted.
const MaxBody = 16 << 10

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
		// One allocation holds both strings.
		var b strings.Builder
		b.Grow(len(f.currency) + len(f.ref))
		b.Write(f.currency[:])
		b.Write(f.ref)
		s := b.String()
		return normalised{AmountCents: f.amount, Currency: s[:len(f.currency)], Reference: s[len(f.currency):]}, nil
	}
	return validateStrict(body)
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

// fastRequest is a valid request as parseFast found it, normalised: ref is
// in the body, or in parseFast's scratch buffer when it had escapes.
type fastRequest struct {
	amount   int64
	currency [3]byte
	ref      []byte
}

// parseFast is the fast path of Validate and Fingerprint. It handles a
// valid request spelt the usual way: a flat object of exactly the three
// fields, in any order, the amount in plain digits (not 2599.0 or
// 2.599e3), the strings with or without escapes. It reports ok only for a
// body validateStrict accepts, and returns then the same normalised
// values; everything else, including every invalid request (whose problem
// is the strict parser's to word), it leaves to validateStrict. It
// allocates nothing unless scratch, which receives strings with escapes,
// must grow.
func parseFast(body, scratch []byte) (f fastRequest, ok bool) {
	// The canonicaliser's rules, for the subset of JSON accepted here:
	// valid UTF-8 (checked for the whole body, as it does), JSON
	// whitespace, strings as fastString reads them, no duplicate member
	// names, nothing after the object.
	if !utf8.Valid(body) {
		return f, false
	}
	var currency, ref []byte
	var seen uint8
	i := skipJSONSpace(body, 0)
	if i == len(body) || body[i] != '{' {
		return f, false
	}
	for {
		i = skipJSONSpace(body, i+1) // after '{' or ','
		var name []byte
		if name, scratch, i, ok = fastString(body, i, scratch); !ok {
			return f, false
		}
		i = skipJSONSpace(body, i)
		if i == len(body) || body[i] != ':' {
			return f, false
		}
		i = skipJSONSpace(body, i+1)
		var bit uint8
		switch string(name) { // the decoded name, as the strict parser compares them
		case "amountCents":
			bit = 1
			f.amount, i, ok = fastAmount(body, i)
		case "currency":
			bit = 2
			currency, scratch, i, ok = fastString(body, i, scratch)
		case "reference":
			bit = 4
			ref, scratch, i, ok = fastString(body, i, scratch)
		}
		if bit == 0 || seen&bit != 0 || !ok {
			return f, false // an unknown or duplicate member, or a value to refuse
		}
		seen |= bit
		i = skipJSONSpace(body, i)
		if i == len(body) {
			return f, false
		}
		if body[i] == '}' {
			break
		}
		if body[i] != ',' {
			return f, false
		}
	}
	if seen != 7 || skipJSONSpace(body, i+1) != len(body) {
		return f, false
	}

	// The checks of validateStrict. strings.ToUpper(strings.TrimSpace(c))
	// is three ASCII letters when the trimmed c is; it can also be when c
	// is not ASCII (ToUpper maps ı to I and ſ to S): that case goes the
	// strict way.
	currency = bytes.TrimSpace(currency) // as strings.TrimSpace
	if len(currency) != len(f.currency) {
		return f, false
	}
	for k, c := range currency {
		switch {
		case 'a' <= c && c <= 'z':
			c -= 'a' - 'A'
		case 'A' <= c && c <= 'Z':
		default:
			return f, false
		}
		f.currency[k] = c
	}
	if !knownCurrency(string(f.currency[:])) {
		return f, false // refused by validateStrict
	}
	ref = bytes.TrimSpace(ref)
	if len(ref) == 0 || utf8.RuneCount(ref) > 100 || bytes.ContainsFunc(ref, unicode.IsControl) {
		return f, false
	}
	f.ref = ref
	return f, true
}

// skipJSONSpace returns the index of the first byte at or after i that is
// not JSON whitespace.
func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// fastAmount reads at body[i] an amount spelt in plain digits that is
// valid: 1 to 1000000000000000. It returns the index after the digits; a
// fraction or an exponent that follows them is not JSON parseFast accepts.
func fastAmount(body []byte, i int) (int64, int, bool) {
	start := i
	var v int64
	for i < len(body) && '0' <= body[i] && body[i] <= '9' {
		if i-start == 16 { // more digits than 1000000000000000
			return 0, i, false
		}
		v = v*10 + int64(body[i]-'0')
		i++
	}
	// No digits, a leading zero (JSON allows none but 0 itself, which is
	// not a valid amount either), or too large.
	if i == start || body[start] == '0' || v > 1e15 {
		return 0, i, false
	}
	return v, i, true
}

// fastString reads the JSON string at body[i] by the canonicaliser's rules:
// no raw control characters, the escapes of JSON, and surrogates escaped
// only in pairs. It returns the string's contents, a part of body or,
// when it has escapes, decoded onto the end of scratch, with scratch and
// the index after the closing quote.
func fastString(body []byte, i int, scratch []byte) (s, scratchOut []byte, next int, ok bool) {
	if i == len(body) || body[i] != '"' {
		return nil, scratch, i, false
	}
	i++
	from := -1 // where s starts in scratch, once there was an escape
	for {
		run := i
		for i < len(body) && body[i] != '"' && body[i] != '\\' && body[i] >= 0x20 {
			i++
		}
		if i == len(body) || body[i] < 0x20 {
			return nil, scratch, i, false
		}
		if body[i] == '"' {
			if from < 0 {
				return body[run:i], scratch, i + 1, true
			}
			scratch = append(scratch, body[run:i]...)
			return scratch[from:], scratch, i + 1, true
		}
		// An escape.
		if from < 0 {
			from = len(scratch)
		}
		scratch = append(scratch, body[run:i]...)
		if i+1 == len(body) {
			return nil, scratch, i, false
		}
		var r rune
		switch e := body[i+1]; e {
		case '"', '\\', '/':
			r = rune(e)
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		case 'u':
			u, ok := hex4(body, i+2)
			if !ok {
				return nil, scratch, i, false
			}
			i += 4
			r = rune(u)
			if utf16.IsSurrogate(r) {
				// A high surrogate must be followed by an escaped
				// low one; anything else is refused.
				lo, ok := rune(0), false
				if r < 0xdc00 && i+3 < len(body) && body[i+2] == '\\' && body[i+3] == 'u' {
					var v uint16
					if v, ok = hex4(body, i+4); ok {
						lo = rune(v)
					}
				}
				if r = utf16.DecodeRune(r, lo); r == utf8.RuneError {
					return nil, scratch, i, false
				}
				i += 6
			}
		default:
			return nil, scratch, i, false
		}
		i += 2
		scratch = utf8.AppendRune(scratch, r)
	}
}

// hex4 returns the value of the four hexadecimal digits at b[at], as a
// \u escape spells them.
func hex4(b []byte, at int) (uint16, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[at:at+4]), 16, 16)
	return uint16(v), err == nil
}

// appendFingerprint appends the JSON of the normalised request, byte for
// byte as json.Marshal writes a normalised: it is hashed into the stored
// fingerprints, so that any difference would refuse every retry of a
// request stored before it.
func appendFingerprint(dst []byte, amount int64, currency, reference []byte) []byte {
	dst = append(dst, `{"amountCents":`...)
	dst = strconv.AppendInt(dst, amount, 10)
	dst = append(dst, `,"currency":`...)
	dst = appendJSONString(dst, currency)
	dst = append(dst, `,"reference":`...)
	dst = appendJSONString(dst, reference)
	return append(dst, '}')
}

// appendJSONString appends s as a JSON string exactly as encoding/json
// writes one: \" \\ \b \f \n \r \t, \u00xx for the other control
// characters, the HTML-safe \u003c \u003e \u0026 for < > &, \u2028 and
// \u2029, and \ufffd for each byte of invalid UTF-8.
func appendJSONString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRune(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[c&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
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

// CheckContentType returns a 415 problem unless the request says its body
// is JSON (application/json, or a +json type such as
// application/merchant+json; parameters such as charset are allowed).
func CheckContentType(r *http.Request) *idem.Problem {
	mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err == nil && (mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		return nil
	}
	got := r.Header.Get("Content-Type")
	if got == "" {
		got = "none"
	}
	return &idem.Problem{Status: http.StatusUnsupportedMediaType, Code: "payment.unsupported_media_type",
		Type:   "https://github.com/idemhq/idem/blob/main/docs/payments.md#validation",
		Title:  "The request body must be JSON",
		Detail: fmt.Sprintf("Send Content-Type: application/json (the request's Content-Type was %s).", got)}
}

// Fingerprint is the middleware's FingerprintFunc for POST /api/payments.
// It runs before the key is claimed, so that a refused request does not
// consume its key: a body that is not declared JSON gets 415, an invalid
// one 400.
func Fingerprint(r *http.Request, body []byte) ([]byte, error) {
	// application/json itself, the usual Content-Type, needs no parsing.
	if r != nil && r.Header.Get("Content-Type") != "application/json" {
		if p := CheckContentType(r); p != nil {
			return nil, p
		}
	}
	var scratch [128]byte
	if f, ok := parseFast(body, scratch[:0]); ok {
		const size = len(`{"amountCents":1000000000000000,"currency":"USD","reference":""}`)
		return appendFingerprint(make([]byte, 0, size+len(f.ref)+16), f.amount, f.currency[:], f.ref), nil
	}
	n, p := validateStrict(body)
	if p != nil {
		return nil, p
	}
	return json.Marshal(n)
}

// Tenant names the tenant of a request: the bearer token of its
// Authorization field (any token is accepted: this is a demo), or the
// anonymous tenant without one. The token itself is never stored: the
// tenant is a hash of it.
func Tenant(r *http.Request) (string, error) {
	auth := r.Header.Get("Authorization")
	if auth == "" {
		return "anonymous", nil
	}
	scheme, token, ok := strings.Cut(auth, " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", &idem.Problem{Status: http.StatusUnauthorized, Code: "auth.invalid",
			Type:   "https://github.com/idemhq/idem/blob/main/docs/payments.md#tenants",
			Title:  "Invalid Authorization header",
			Detail: "Send Authorization: Bearer <token>, or no Authorization header for the anonymous tenant."}
	}
	sum := sha256.Sum256([]byte(token))
	return "t_" + hex.EncodeToString(sum[:12]), nil
}

// ValidTenant reports whether s is a tenant as Tenant names one:
// "anonymous", or "t_" and 24 lower-case hexadecimal digits.
func ValidTenant(s string) bool {
	if s == "anonymous" {
		return true
	}
	h, ok := strings.CutPrefix(s, "t_")
	return ok && len(h) == 24 && strings.Trim(h, "0123456789abcdef") == ""
}

// Create handles POST /api/payments, behind the idem middleware.
func (s *Service) Create(w http.ResponseWriter, r *http.Request) {
	n, ok := s.request(w, r)
	if !ok {
		return
	}
	tenant, err := Tenant(r)
	if err != nil {
		idem.WriteProblem(w, err.(*idem.Problem))
		return
	}
	ctx := r.Context()
	// The delay is the slow, non-database part of the operation, done
	// before the write transaction begins.
	if s.OpDelay > 0 {
		t := time.NewTimer(s.OpDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			logFailure(ctx, s.Logger, r, http.StatusServiceUnavailable, "payment.cancelled", context.Cause(ctx))
			writeProblem(w, http.StatusServiceUnavailable, "payment.cancelled", "The payment was cancelled", context.Cause(ctx).Error())
			return
		}
	}
	info, _ := idem.InfoFromContext(ctx)
	pay := Payment{
		ID: newID(), AmountCents: n.AmountCents, Currency: n.Currency, Reference: n.Reference,
		CreatedAt: s.now().UTC().Truncate(time.Microsecond), tenant: tenant,
	}
	if info != nil {
		pay.key = info.Key
	}
	ictx, cancel := context.WithTimeout(ctx, DBTimeout)
	pay, err = s.Repo.Insert(ictx, pay)
	if err == nil && s.OnCreateFunc != nil {
		err = s.OnCreateFunc(ictx, pay, tenant)
	}
	cancel()
	var rejected *RejectedError
	switch {
	case errors.As(err, &rejected):
		// The database refused the data itself: retrying cannot help, so
		// this is the request's answer, stored and replayed like any 4xx.
		writeProblem(w, http.StatusUnprocessableEntity, "payment.rejected", "The database refused the payment", rejected.Reason)
		return
	case err != nil:
		logFailure(ctx, s.Logger, r, http.StatusServiceUnavailable, "payment.unavailable", err)
		writeProblem(w, http.StatusServiceUnavailable, "payment.unavailable", "The payment could not be stored", "Retry with the same Idempotency-Key.")
		return
	}
	if s.FailReference != "" && pay.Reference == s.FailReference {
		logFailure(ctx, s.Logger, r, http.StatusInternalServerError, "payment.failed", errors.New("the reference is --fail-reference: failing on purpose"))
		writeProblem(w, http.StatusInternalServerError, "payment.failed", "The payment failed",
			"This reference is configured to fail after the payment was written (--fail-reference); nothing was kept.")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/api/payments/"+pay.ID)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(pay)
}

// Get handles GET /api/payments/{id}: the tenant's own payments only.
func (s *Service) Get(w http.ResponseWriter, r *http.Request) {
	tenant, err := Tenant(r)
	if err != nil {
		idem.WriteProblem(w, err.(*idem.Problem))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), DBTimeout)
	defer cancel()
	p, err := s.Repo.Get(ctx, tenant, r.PathValue("id"))
	switch {
	case errors.Is(err, ErrNotFound):
		writeProblem(w, http.StatusNotFound, "payment.not_found", "Payment not found", "No payment with this id exists for your tenant.")
		return
	case err != nil:
		logFailure(ctx, s.Logger, r, http.StatusServiceUnavailable, "payment.unavailable", err)
		writeProblem(w, http.StatusServiceUnavailable, "payment.unavailable", "Payments are unavailable", "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(p)
}

// Count handles GET /api/payments/count.
func (s *Service) Count(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), DBTimeout)
	defer cancel()
	n, err := s.Repo.Count(ctx)
	if err != nil {
		logFailure(ctx, s.Logger, r, http.StatusServiceUnavailable, "payment.unavailable", err)
		writeProblem(w, http.StatusServiceUnavailable, "payment.unavailable", "Payments are unavailable", "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"count\":%d}\n", n)
}

// request returns the validated, normalised payment request: the one the
// middleware's FingerprintFunc (Fingerprint) already produced, or, outside
// the middleware, the body validated here.
func (s *Service) request(w http.ResponseWriter, r *http.Request) (normalised, bool) {
	var n normalised
	if p := CheckContentType(r); p != nil {
		idem.WriteProblem(w, p)
		return n, false
	}
	if info, ok := idem.InfoFromContext(r.Context()); ok && info.Payload != nil {
		if err := json.Unmarshal(info.Payload, &n); err == nil {
			return n, true
		}
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "payment.unreadable", "The request body could not be read", err.Error())
		return n, false
	}
	n, p := Validate(body)
	if p != nil {
		idem.WriteProblem(w, p)
		return n, false
	}
	return n, true
}

func (s *Service) now() time.Time {
	if s.NowFunc != nil {
		return s.NowFunc()
	}
	return time.Now()
}

func writeProblem(w http.ResponseWriter, status int, code, title, detail string) {
	idem.WriteProblem(w, &idem.Problem{Status: status, Code: code, Title: title, Detail: detail,
		Type: "https://github.com/idemhq/idem/blob/main/docs/payments.md#errors"})
}

// newID returns a random payment id.
func newID() string {
	return "pay_" + strings.ToLower(rand.Text())
}

// ValidPaymentID reports whether s is a payment id as the API makes them:
// "pay_" and 26 characters of lower-case base32 (a-z, 2-7).
func ValidPaymentID(s string) bool {
	b, ok := strings.CutPrefix(s, "pay_")
	return ok && len(b) == 26 && strings.Trim(b, "abcdefghijklmnopqrstuvwxyz234567") == ""
}

// createTable is the payments table's DDL, the same on every database but
// for the types of the amount and of the creation time.
func createTable(integer, timestamp string) string {
	return `CREATE TABLE IF NOT EXISTS payments (
		id              TEXT PRIMARY KEY,
		tenant          TEXT NOT NULL,
		idempotency_key TEXT NOT NULL,
		amount_cents    ` + integer + ` NOT NULL,
		currency        TEXT NOT NULL,
		reference       TEXT NOT NULL,
		created_at      ` + timestamp + ` NOT NULL,
		UNIQUE (tenant, idempotency_key)
	)`
}
