package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemclient"
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
	// Status is "pending" until the provider charged it, then "captured".
	Status string `json:"status,omitempty"`
	// ChargeID is the provider's charge id, once captured.
	ChargeID string `json:"chargeId,omitempty"`
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
	// GetStep returns the tenant's payment id with its provider fields.
	GetStep(ctx context.Context, tenant, id string) (StepPayment, error)
	// Counts returns the number of payments and of captured ones.
	Counts(ctx context.Context) (all, captured int64, err error)
}

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

// DefaultProviderBudget is how long one request keeps retrying the
// provider by default.
const DefaultProviderBudget = 10 * time.Second

// ProviderService serves POST /api/payments in three steps: (1) the
// payment row is inserted as pending with a recovery point; (2) the
// provider is charged with the key derived for step "charge", retried with
// that key on connection errors, 409, 429 and 5xx within Budget; (3) the
// payment is captured and the response stored, in one transaction.
type ProviderService struct {
	Repo StepRepo
	// URL is the provider's base URL (http://host:port).
	URL string
	// Client calls the provider. Defaults to an idemclient client.
	Client *http.Client
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
	Logger  *slog.Logger
}

// providerAttempt is the per-call state idemclient's AttemptFunc reports
// to, found through the request's context.
type providerAttempt struct{ unknown bool }

type attemptKey struct{}

// NewProviderClient returns the HTTP client the service calls the provider
// with: idemclient (the key comes from the context, see
// idemclient.WithDerivedKey) retrying connection errors, 409 with
// Retry-After, 429, 502, 503 and 504 with jittered back-off.
func NewProviderClient() (*http.Client, error) {
	return idemclient.NewClient(&idemclient.Config{
		MaxAttempts: 1000, // the context's deadline (the budget) bounds retries
		MaxElapsed:  time.Hour,
		BackoffBase: 20 * time.Millisecond,
		BackoffCap:  500 * time.Millisecond,
		AttemptFunc: func(req *http.Request, a idemclient.Attempt) {
			var op *net.OpError
			if st, ok := req.Context().Value(attemptKey{}).(*providerAttempt); ok && a.Err != nil &&
				!(errors.As(a.Err, &op) && op.Op == "dial") {
				// Maybe sent, and no answer: the charge may have happened.
				// (A refused connection sent nothing.)
				st.unknown = true
			}
		},
	})
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
	var n normalised
	info, ok := idem.InfoFromContext(r.Context())
	if !ok || json.Unmarshal(info.Payload, &n) != nil {
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
// payment, or a 503 problem (the outcome policy then leaves the record in
// flight at its last recovery point).
func (s *ProviderService) Run(ctx context.Context, req StepPayment) *idem.Response {
	data, err := idem.Step(ctx, stepPayment, func(ctx context.Context) ([]byte, error) {
		pk, err := idem.DeriveKey(ctx, stepCharge)
		if err != nil {
			return nil, err
		}
		p := req
		p.ID, p.Status, p.ProviderKey = newID(), "pending", pk
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
	charge, err := idem.Step(ctx, stepCharge, func(ctx context.Context) ([]byte, error) {
		id, err := s.charge(ctx, p)
		if err != nil {
			return nil, err
		}
		s.crash("after-charge")
		return []byte(id), nil
	})
	if err != nil {
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
	p.Status, p.ChargeID, p.ProviderKey = "captured", string(charge), ""
	var body bytes.Buffer
	_ = json.NewEncoder(&body).Encode(p)
	return &idem.Response{StatusCode: http.StatusCreated, Body: body.Bytes(), Header: http.Header{
		"Content-Type": {"application/json"},
		"Location":     {"/api/payments/" + p.ID},
	}}
}

// charge calls the provider until it answers 201 or the budget ends. The
// error wraps idem.ErrOutcomeUnknown when some attempt went unanswered.
func (s *ProviderService) charge(ctx context.Context, p StepPayment) (string, error) {
	budget := s.Budget
	if budget <= 0 {
		budget = DefaultProviderBudget
	}
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	ctx, err := idemclient.WithDerivedKey(ctx, stepCharge)
	if err != nil {
		return "", err
	}
	st := &providerAttempt{}
	ctx = context.WithValue(ctx, attemptKey{}, st)
	body, _ := json.Marshal(map[string]any{"amountCents": p.AmountCents, "currency": p.Currency, "reference": p.Reference})
	var last error
	for n := 0; ; n++ {
		id, retry, err := s.chargeOnce(ctx, body)
		if err == nil {
			return id, nil
		}
		last = err
		if !retry {
			break
		}
		// What idemclient does not retry itself (500, 409 without
		// Retry-After) is retried here, with jitter.
		d := time.Duration(mrand.Int64N(int64(min(20*time.Millisecond<<min(n, 5), 500*time.Millisecond)) + 1))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			last = errors.Join(last, ctx.Err())
			retry = false
		case <-t.C:
		}
		if !retry {
			break
		}
	}
	if st.unknown {
		return "", fmt.Errorf("provider: %w: %w", idem.ErrOutcomeUnknown, last)
	}
	return "", fmt.Errorf("provider: %w", last)
}

// chargeOnce sends one charge (with idemclient's own retries) and says
// whether another try may help.
func (s *ProviderService) chargeOnce(ctx context.Context, body []byte) (string, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return "", false, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.Client.Do(req)
	if err != nil {
		return "", ctx.Err() == nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", true, err
	}
	switch {
	case resp.StatusCode == http.StatusCreated:
		var c struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(raw, &c); err != nil || c.ID == "" {
			return "", false, fmt.Errorf("provider answered 201 without a charge id")
		}
		return c.ID, false, nil
	case resp.StatusCode == http.StatusConflict, resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode >= 500:
		return "", true, fmt.Errorf("provider answered %d", resp.StatusCode)
	}
	return "", false, fmt.Errorf("provider refused the charge: %d %s", resp.StatusCode, bytes.TrimSpace(raw))
}

func (s *ProviderService) now() time.Time {
	if s.NowFunc != nil {
		return s.NowFunc()
	}
	return time.Now()
}

// problemResponse is a problem+json response, as idem.WriteProblem would
// write it, for an operation that returns its response.
func problemResponse(status int, code, title, detail string, retryAfter int) *idem.Response {
	body, _ := json.Marshal(map[string]any{
		"type":   "https://github.com/idemhq/idem/blob/main/docs/payments.md#errors",
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
// {"count":N,"captured":M}.
func (s *ProviderService) Count(w http.ResponseWriter, r *http.Request) {
	all, captured, err := s.Repo.Counts(r.Context())
	if err != nil {
		logFailure(r.Context(), s.Logger, r, http.StatusServiceUnavailable, "payment.unavailable", err)
		writeProblem(w, http.StatusServiceUnavailable, "payment.unavailable", "Payments are unavailable", "")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"count\":%d,\"captured\":%d}\n", all, captured)
}

// Resume is the reconciler's resume function for Executor.Reconcile: it
// rebuilds the operation of a stuck payment from its recovery point.
func (s *ProviderService) Resume(_ context.Context, rec idem.StuckRecord) (idem.Operation, error) {
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
			return func(ctx context.Context) (*idem.Response, error) { return s.Run(ctx, p), nil }, nil
		}
	}
	return nil, errors.New("payments: the stuck record has no payment step")
}
