package payments

import (
	"context"
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

	"github.com/idemhq/idem"
)

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
		if n, ok := fromPayload(info.Payload); ok {
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
