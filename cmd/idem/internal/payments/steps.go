package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// StepPayment is a payment made through a provider (idem serve
// --provider): a pending row, then a charge at the provider, then captured
// with the provider's charge id.
type StepPayment struct {
	ID          string    `json:"id"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
	Reference   string    `json:"reference"`
	CreatedAt   time.Time `json:"createdAt"`
	// Status is "pending" until the provider answered, then "captured"
	// or, if the provider declined the charge, "failed".
	Status string `json:"status,omitempty"`
	// ChargeID is the provider's charge id, once captured.
	ChargeID string `json:"chargeId,omitempty"`
	// FailureCode and FailureReason are the provider's code (such as
	// card_declined) and explanation of a failed payment.
	FailureCode   string `json:"failureCode,omitempty"`
	FailureReason string `json:"failureReason,omitempty"`
	// ProviderKey is the Idempotency-Key sent to the provider (derived
	// from the client's key): the correlation between both keys. GET
	// shows it; the POST answer does not.
	ProviderKey string `json:"providerKey,omitempty"`

	// Tenant and Key identify the client's request for InsertPending's
	// uniqueness; they are never shown nor kept in the recovery point.
	Tenant string `json:"-"`
	Key    string `json:"-"`
}

// StepRepo stores provider payments. InsertPending and Capture write
// through the idempotent execution's transaction.
type StepRepo interface {
	// MigrateSteps adds the provider columns and returns the deployment's
	// key-derivation secret, created at random on first use and kept in
	// the database, so that every instance and restart derives the same
	// provider keys.
	MigrateSteps(ctx context.Context) ([]byte, error)
	// InsertPending stores p with status "pending", or returns the
	// payment already stored for the same tenant and key.
	InsertPending(ctx context.Context, p StepPayment) (StepPayment, error)
	// Capture marks payment id captured with the provider's charge id.
	Capture(ctx context.Context, id, chargeID string) error
	// Fail marks payment id failed with the provider's code and reason,
	// through the execution's transaction.
	Fail(ctx context.Context, id, code, reason string) error
	// GetStep returns the tenant's payment id with its provider fields.
	GetStep(ctx context.Context, tenant, id string) (StepPayment, error)
	// Counts returns the number of payments, of captured ones and of
	// failed ones.
	Counts(ctx context.Context) (StepCounts, error)
}

// StepCounts are the payment counts of GET /api/payments/count in
// provider mode.
type StepCounts struct {
	All, Captured, Failed int64
}

// Payment statuses in provider mode.
const (
	StatusPending  = "pending"
	StatusCaptured = "captured"
	StatusFailed   = "failed"
)

// Step names, which also name the derived keys.
const (
	stepPayment = "payment"
	stepCharge  = "charge"
)

// StepNames are the steps of a provider payment, in order (for the
// operator console, which shows the ones not reached yet as pending).
var StepNames = []string{stepPayment, stepCharge}

// CodeStepIncomplete is the problem code of a 503 for a payment whose
// provider step did not complete within the budget: the payment stays
// pending and a retry with the same key resumes it.
const CodeStepIncomplete = "idempotency.step_incomplete"

// CodeDeclined is the problem code of the 402 for a payment the provider
// declined: the payment failed, and the answer is stored and replayed.
const CodeDeclined = "payment.declined"

// DefaultProviderBudget is how long one request keeps retrying the
// provider by default.
const DefaultProviderBudget = 10 * time.Second

// ProviderService serves POST /api/payments in three steps: (1) the
// payment row is inserted as pending with a recovery point; (2) the
// provider is charged with the key derived for step "charge", retried with
// that key on the answers answer.go calls retryable within Budget; (3) the
// payment is captured and the response stored, in one transaction. A
// provider's final refusal instead marks the payment failed and stores a
// 402 payment.declined, in one transaction.
type ProviderService struct {
	Repo StepRepo
	// URL is the provider's base URL (http://host:port).
	URL string
	// Client calls the provider for a client's request. Defaults to
	// NewProviderClient(DefaultRequestAttempts).
	Client *http.Client
	// ReconcileClient calls the provider for the reconciler, which sends
	// one round of attempts per payment and pass: the next pass is its
	// next retry. Defaults to NewProviderClient(DefaultReconcileAttempts).
	ReconcileClient *http.Client
	// Budget bounds the provider step of one attempt. Defaults to
	// DefaultProviderBudget.
	Budget time.Duration
	// NowFunc is the clock for createdAt. Defaults to time.Now.
	NowFunc func() time.Time
	// CrashAt, if set, names a step boundary at which the process kills
	// itself with SIGKILL, once (a test hook for crash tests; see
	// docs/development.md): payment-written, after-payment, after-charge,
	// after-charge-recorded, after-capture.
	CrashAt string
	// Observer, if set, is told about every provider attempt and charge
	// outcome (idem serve's /metrics).
	Observer ChargeObserver
	Logger   *slog.Logger
}

func (s *ProviderService) crash(point string) {
	if s.CrashAt == point {
		s.logger().Warn("crash point reached: killing the process (test hook)", "point", point)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}

// keyAttr is the execution's idempotency key for a log line, redacted
// (idem.RedactKey), or nothing outside an execution.
func keyAttr(ctx context.Context) slog.Attr {
	if info, ok := idem.InfoFromContext(ctx); ok && info.Key != "" {
		return slog.String("key", idem.RedactKey(info.Key))
	}
	return slog.Attr{}
}

func (s *ProviderService) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.Default()
}

// Create handles POST /api/payments behind the idem middleware.
func (s *ProviderService) Create(w http.ResponseWriter, r *http.Request) {
	info, ok := idem.InfoFromContext(r.Context())
	var n normalised
	if ok {
		n, ok = fromPayload(info.Payload)
	}
	if !ok {
		logFailure(r.Context(), s.Logger, r, http.StatusInternalServerError, "payment.internal", errors.New("no validated payment in the request's context"))
		writeProblem(w, http.StatusInternalServerError, "payment.internal", "Internal error", "")
		return
	}
	tenant, err := Tenant(r)
	if err != nil {
		idem.WriteProblem(w, err.(*idem.Problem))
		return
	}
	resp := s.Run(r.Context(), StepPayment{AmountCents: n.AmountCents, Currency: n.Currency, Reference: n.Reference, Tenant: tenant, Key: info.Key})
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(resp.Body)
}

// Run runs (or resumes) the three steps for req inside an idempotent
// execution and returns the response to store: 201 with the captured
// payment, 402 payment.declined for a payment the provider declined, or a
// 503 problem (the outcome policy then leaves the record in flight at its
// last recovery point).
func (s *ProviderService) Run(ctx context.Context, req StepPayment) *idem.Response {
	return s.run(ctx, req, false)
}

// run is Run; reconcile tells that the reconciler resumes the payment,
// which then makes one round of provider attempts instead of retrying for
// the whole budget.
func (s *ProviderService) run(ctx context.Context, req StepPayment, reconcile bool) *idem.Response {
	data, err := idem.Step(ctx, stepPayment, func(ctx context.Context) ([]byte, error) {
		pk, err := idem.DeriveKey(ctx, stepCharge)
		if err != nil {
			return nil, err
		}
		p := req
		p.ID, p.Status, p.ProviderKey = newID(), StatusPending, pk
		p.CreatedAt = s.now().UTC().Truncate(time.Microsecond)
		if p, err = s.Repo.InsertPending(ctx, p); err != nil {
			return nil, err
		}
		s.crash("payment-written")
		// The recovery point holds what the later steps need; the
		// client's key and tenant are not serialised.
		return json.Marshal(p)
	})
	if err != nil {
		s.logger().Warn("payment step failed", keyAttr(ctx), "error", err)
		return problemResponse(http.StatusServiceUnavailable, "payment.unavailable", "The payment could not be stored", "Retry with the same Idempotency-Key.", 1)
	}
	s.crash("after-payment")
	var p StepPayment
	if err := json.Unmarshal(data, &p); err != nil {
		s.logger().Error("the payment step's recovery point is unreadable", keyAttr(ctx), "error", err)
		return problemResponse(http.StatusInternalServerError, "payment.internal", "Internal error", "", 0)
	}
	// A payment the table already holds as finished (its record expired,
	// and the key came back) is answered from the table: the provider is
	// never asked again.
	switch p.Status {
	case StatusCaptured:
		return capturedResponse(p)
	case StatusFailed:
		return declinedResponse(p, &DeclineError{Code: p.FailureCode, Reason: p.FailureReason})
	}
	var declined *DeclineError
	charge, err := idem.Step(ctx, stepCharge, func(ctx context.Context) ([]byte, error) {
		id, err := s.charge(ctx, p, reconcile)
		if err != nil {
			return nil, err
		}
		s.crash("after-charge")
		return []byte(id), nil
	})
	switch {
	case errors.As(err, &declined):
		// Final: the payment fails, in the transaction that stores the
		// 402, so that every retry replays it and nothing charges it
		// again.
		if err := s.Repo.Fail(ctx, p.ID, declined.Code, declined.Reason); err != nil {
			s.logger().Warn("recording the declined payment failed", "payment", p.ID, keyAttr(ctx), "error", err)
			return problemResponse(http.StatusServiceUnavailable, "payment.unavailable", "The payment could not be stored", "Retry with the same Idempotency-Key.", 1)
		}
		p.Status, p.FailureCode, p.FailureReason = StatusFailed, declined.Code, declined.Reason
		return declinedResponse(p, declined)
	case err != nil:
		s.logger().Warn("provider step incomplete; the payment stays pending", "payment", p.ID, keyAttr(ctx), "error", err)
		return problemResponse(http.StatusServiceUnavailable, CodeStepIncomplete, "The payment is not complete yet",
			"The provider could not be charged in time. The payment is pending; retry with the same Idempotency-Key to resume it.", 1)
	}
	s.crash("after-charge-recorded")
	// Step 3 commits with the stored response.
	if err := s.Repo.Capture(ctx, p.ID, string(charge)); err != nil {
		s.logger().Warn("capture failed", "payment", p.ID, keyAttr(ctx), "error", err)
		return problemResponse(http.StatusServiceUnavailable, "payment.unavailable", "The payment could not be stored", "Retry with the same Idempotency-Key.", 1)
	}
	p.Status, p.ChargeID = StatusCaptured, string(charge)
	return capturedResponse(p)
}

// capturedResponse is the 201 of a captured payment. The provider key is
// shown by GET only.
func capturedResponse(p StepPayment) *idem.Response {
	p.ProviderKey = ""
	var body bytes.Buffer
	_ = json.NewEncoder(&body).Encode(p)
	return &idem.Response{StatusCode: http.StatusCreated, Body: body.Bytes(), Header: http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/api/payments/" + p.ID},
	}}
}

// declinedResponse is the 402 payment.declined of a payment the provider
// refused, with the provider's status (when known), code and reason, and
// the payment's id for GET.
func declinedResponse(p StepPayment, d *DeclineError) *idem.Response {
	doc := map[string]any{
		"type":   problemType,
		"title":  "The payment was declined",
		"status": http.StatusPaymentRequired,
		"detail": "The provider declined the charge: " + strings.TrimRight(d.Reason, ".") + ". Nothing was charged and the payment failed; " +
			"a retry with this Idempotency-Key gets this answer again.",
		"code":         CodeDeclined,
		"paymentId":    p.ID,
		"providerCode": d.Code,
	}
	if d.Status != 0 {
		doc["providerStatus"] = d.Status
	}
	body, _ := json.Marshal(doc)
	return &idem.Response{StatusCode: http.StatusPaymentRequired, Body: append(body, '\n'), Header: http.Header{
		"Content-Type": {"application/problem+json"},
	}}
}

func (s *ProviderService) now() time.Time {
	if s.NowFunc != nil {
		return s.NowFunc()
	}
	return time.Now()
}

// problemType is the type of the demo's problems.
const problemType = "https://github.com/idemhq/idem/blob/main/docs/payments.md#errors"

// problemResponse is a problem+json response, as idem.WriteProblem would
// write it, for an operation that returns its response.
func problemResponse(status int, code, title, detail string, retryAfter int) *idem.Response {
	body, _ := json.Marshal(map[string]any{
		"type":   problemType,
		"title":  title,
		"status": status,
		"detail": detail,
		"code":   code,
	})
	h := http.Header{"Content-Type": {"application/problem+json"}}
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	return &idem.Response{StatusCode: status, Header: h, Body: append(body, '\n')}
}

// GetStep handles GET /api/payments/{id} in provider mode: status,
// chargeId and the provider key.
func (s *ProviderService) GetStep(w http.ResponseWriter, r *http.Request) {
	tenant, err := Tenant(r)
	if err != nil {
		idem.WriteProblem(w, err.(*idem.Problem))
		return
	}
	p, err := s.Repo.GetStep(r.Context(), tenant, r.PathValue("id"))
	switch {
	case errors.Is(err, ErrNotFound):
		writeProblem(w, http.StatusNotFound, "payment.not_found", "Payment not found", "No payment with this id exists for your tenant.")
		return
	case err != nil:
		logFailure(r.Context(), s.Logger, r, http.StatusServiceUnavailable, "payment.unavailable", err)
		writeProblem(w, http.StatusServiceUnavailable, "payment.unavailable", "Payments are unavailable", "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(p)
}

// Count handles GET /api/payments/count in provider mode:
// {"count":N,"captured":M,"failed":F}.
func (s *ProviderService) Count(w http.ResponseWriter, r *http.Request) {
	c, err := s.Repo.Counts(r.Context())
	if err != nil {
		logFailure(r.Context(), s.Logger, r, http.StatusServiceUnavailable, "payment.unavailable", err)
		writeProblem(w, http.StatusServiceUnavailable, "payment.unavailable", "Payments are unavailable", "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"count\":%d,\"captured\":%d,\"failed\":%d}\n", c.All, c.Captured, c.Failed)
}

// Resume is the reconciler's resume function for Executor.Reconcile: it
// rebuilds the operation of a stuck payment from its recovery point.
func (s *ProviderService) Resume(_ context.Context, rec idemstore.StuckRecord) (idem.Operation, error) {
	steps, err := idem.ParseCheckpoint(rec.Checkpoint)
	if err != nil {
		return nil, err
	}
	for _, st := range steps {
		if st.Name == stepPayment && st.Done {
			var p StepPayment
			if err := json.Unmarshal(st.Data, &p); err != nil {
				return nil, err
			}
			return func(ctx context.Context) (*idem.Response, error) { return s.run(ctx, p, true), nil }, nil
		}
	}
	return nil, errors.New("payments: the stuck record has no payment step")
}
