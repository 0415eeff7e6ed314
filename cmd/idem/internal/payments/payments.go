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
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemhq/idem"
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
func Validate(body []byte) (normalised, *idem.Problem) {
	// The strict JSON rules of the core (valid UTF-8, no duplicate member
	// names) apply here too: this hook replaces its fingerprint.
	if _, err := idem.AppendCanonicalJSON(nil, body); err != nil {
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
		canon, _ := idem.AppendCanonicalJSON(nil, raw)
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
		if len(c) != 3 || strings.Trim(c, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") != "" {
			errs["currency"] = append(errs["currency"], "must be a 3-letter currency code such as USD")
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
	if len(errs) > 0 {
		return normalised{}, invalid(errs)
	}
	return n, nil
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
	if r != nil {
		if p := CheckContentType(r); p != nil {
			return nil, p
		}
	}
	n, p := Validate(body)
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
		writeProblem(w, http.StatusServiceUnavailable, "payment.unavailable", "The payment could not be stored", "Retry with the same Idempotency-Key.")
		return
	}
	if s.FailReference != "" && pay.Reference == s.FailReference {
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
