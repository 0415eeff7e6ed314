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
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemclient"
)

// Attempts of the provider clients (NewProviderClient).
const (
	// DefaultRequestAttempts bounds idemclient's attempts in one charge
	// call of a client's request; the budget's deadline ends them first.
	DefaultRequestAttempts = 1000
	// DefaultReconcileAttempts bounds the reconciler's round of attempts
	// for one payment in one pass: a few quick retries of what fails fast
	// (a refused connection, a 503).
	DefaultReconcileAttempts = 3
)

// Charge outcome labels: how one provider step ended
// (ChargeObserver.ChargeOutcome).
const (
	// OutcomeCaptured: the provider answered a charge id.
	OutcomeCaptured = "captured"
	// OutcomeDeclined: the provider refused the charge; the payment failed.
	OutcomeDeclined = "declined"
	// OutcomeUnknown: the step ended without knowing whether the provider
	// charged (answers lost after sending, or outside its contract); the
	// payment stays pending and is resumed with the same key.
	OutcomeUnknown = "unknown"
	// OutcomeIncomplete: the step ended with retryable answers only; the
	// payment stays pending and is resumed with the same key.
	OutcomeIncomplete = "incomplete"
	// OutcomeError: a local failure before the provider could be called.
	OutcomeError = "error"
)

// Answers returns every Answer* label.
func Answers() []string {
	return []string{AnswerCreated, AnswerDeclined, AnswerRetryable, AnswerUnexpected, AnswerRefused, AnswerLost}
}

// Outcomes returns every Outcome* label.
func Outcomes() []string {
	return []string{OutcomeCaptured, OutcomeDeclined, OutcomeUnknown, OutcomeIncomplete, OutcomeError}
}

// ChargeObserver is told what the provider step does, for metrics. Its
// methods run on the request's goroutine and must return quickly.
type ChargeObserver interface {
	// ChargeAttempt is called after every HTTP attempt at the provider
	// with what its answer meant (an Answer* label), and whether another
	// attempt with the same key follows.
	ChargeAttempt(answer string, retry bool)
	// ChargeOutcome is called once per provider step with how it ended
	// (an Outcome* label).
	ChargeOutcome(outcome string)
}

// NewProviderClient returns an HTTP client the service calls the provider
// with: idemclient (the key comes from the context, see
// idemclient.WithDerivedKey) retrying connection errors, 409 with
// Retry-After, 429, 502, 503 and 504 with jittered back-off, at most
// maxAttempts times per call.
func NewProviderClient(maxAttempts int) (*http.Client, error) {
	return idemclient.NewClient(&idemclient.Config{
		MaxAttempts: maxAttempts,
		MaxElapsed:  time.Hour, // the context's deadline (the budget) bounds retries
		BackoffBase: 20 * time.Millisecond,
		BackoffCap:  500 * time.Millisecond,
		AttemptFunc: func(req *http.Request, a idemclient.Attempt) {
			if cr, ok := req.Context().Value(chargeRunKey{}).(*chargeRun); ok {
				cr.attempt(a)
			}
		},
	})
}

// chargeRun is the state of one provider step, which idemclient's
// AttemptFunc reports to through the request's context.
type chargeRun struct {
	s         *ProviderService
	p         StepPayment
	reconcile bool
	attempts  int
	// unknown reports that some attempt may have reached the provider and
	// went unanswered, or got an answer outside its contract: the charge
	// may have been made.
	unknown bool
}

type chargeRunKey struct{}

// attempt records one of idemclient's attempts. Those that get another
// attempt are reported here; the last one's answer goes back to
// chargeOnce, which reads its body and reports it, unless it is an error.
func (cr *chargeRun) attempt(a idemclient.Attempt) {
	if a.Err != nil {
		label := AnswerLost
		var op *net.OpError
		if errors.As(a.Err, &op) && op.Op == "dial" {
			label = AnswerRefused // nothing was sent
		} else {
			cr.unknown = true // maybe sent, and no answer
		}
		cr.report(label, a.Retry, slog.Any("error", a.Err), slog.Duration("delay", a.Delay))
		return
	}
	if a.Retry {
		class, _, _, desc := classify(a.StatusCode, nil)
		cr.report(class.label(), true, slog.String("answer", desc), slog.Duration("delay", a.Delay))
	}
}

// report counts one provider attempt and logs it if another follows.
func (cr *chargeRun) report(answer string, retry bool, attrs ...slog.Attr) {
	cr.attempts++
	if o := cr.s.Observer; o != nil {
		o.ChargeAttempt(answer, retry)
	}
	if retry {
		attrs = append([]slog.Attr{slog.String("payment", cr.p.ID), slog.Int("attempt", cr.attempts),
			slog.String("result", answer), slog.Bool("reconcile", cr.reconcile)}, attrs...)
		cr.s.logger().LogAttrs(context.Background(), slog.LevelInfo, "provider charge attempt failed; retrying with the same key", attrs...)
	}
}

// outcome counts and logs how the provider step ended.
func (cr *chargeRun) outcome(outcome string, attrs ...slog.Attr) {
	if o := cr.s.Observer; o != nil {
		o.ChargeOutcome(outcome)
	}
	attrs = append([]slog.Attr{slog.String("payment", cr.p.ID), slog.String("outcome", outcome), slog.Int("attempts", cr.attempts),
		slog.Bool("reconcile", cr.reconcile), slog.String("provider_key", idem.RedactKey(cr.p.ProviderKey))}, attrs...)
	level := slog.LevelInfo
	if outcome == OutcomeUnknown || outcome == OutcomeIncomplete || outcome == OutcomeError {
		level = slog.LevelWarn
	}
	cr.s.logger().LogAttrs(context.Background(), level, "provider charge "+outcome, attrs...)
}

// charge calls the provider until it answers a charge id or a refusal, or
// the budget ends: retryable answers and lost ones are retried with the
// same key. For the reconciler it makes one round (ReconcileClient's
// attempts): the next pass is its next retry. A refusal is a
// *DeclineError; an ending without an answer wraps idem.ErrOutcomeUnknown
// when some attempt may have charged.
func (s *ProviderService) charge(ctx context.Context, p StepPayment, reconcile bool) (string, error) {
	cr := &chargeRun{s: s, p: p, reconcile: reconcile}
	budget := s.Budget
	if budget <= 0 {
		budget = DefaultProviderBudget
	}
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	ctx, err := idemclient.WithDerivedKey(ctx, stepCharge)
	if err != nil {
		cr.outcome(OutcomeError, slog.Any("error", err))
		return "", err
	}
	ctx = context.WithValue(ctx, chargeRunKey{}, cr)
	client, err := s.client(reconcile)
	if err != nil {
		cr.outcome(OutcomeError, slog.Any("error", err))
		return "", err
	}
	body, _ := json.Marshal(map[string]any{"amountCents": p.AmountCents, "currency": p.Currency, "reference": p.Reference})
	var last error
	for n := 0; ; n++ {
		id, class, err := s.chargeOnce(ctx, client, body)
		last = err
		// What idemclient does not retry itself (500, 408, 425, 409
		// without Retry-After, a cut-off answer, and transport errors once
		// its attempts ran out) is retried here with jitter, for a
		// client's request; the reconciler's round ends.
		again := !reconcile && ctx.Err() == nil
		switch class {
		case classCreated:
			cr.report(AnswerCreated, false)
			cr.outcome(OutcomeCaptured, slog.String("charge", id))
			return id, nil
		case classDeclined:
			var d *DeclineError
			errors.As(err, &d)
			cr.report(AnswerDeclined, false)
			cr.outcome(OutcomeDeclined, slog.Int("status", d.Status), slog.String("code", d.Code), slog.String("reason", d.Reason))
			return "", err
		case classUnexpected:
			// The provider would answer the same again to the same key:
			// only a later attempt (or an operator) can tell.
			cr.unknown, again = true, false
			cr.report(AnswerUnexpected, false, slog.Any("error", err))
		case classRetryable:
			cr.report(AnswerRetryable, again, slog.Any("error", err))
		case classLost:
			cr.unknown = true
			cr.report(AnswerLost, again, slog.Any("error", err))
		}
		// A transport error (class 0) was reported by idemclient's
		// AttemptFunc.
		if !again {
			break
		}
		d := time.Duration(mrand.Int64N(int64(min(20*time.Millisecond<<min(n, 5), 500*time.Millisecond)) + 1))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			last = errors.Join(last, ctx.Err())
		case <-t.C:
		}
		if ctx.Err() != nil {
			break
		}
	}
	if cr.unknown {
		cr.outcome(OutcomeUnknown, slog.Any("error", last))
		return "", fmt.Errorf("provider: %w: %w", idem.ErrOutcomeUnknown, last)
	}
	cr.outcome(OutcomeIncomplete, slog.Any("error", last))
	return "", fmt.Errorf("provider: %w", last)
}

// client returns the provider client of a client's request or of the
// reconciler, building the default one if none was set.
func (s *ProviderService) client(reconcile bool) (*http.Client, error) {
	switch {
	case !reconcile && s.Client != nil:
		return s.Client, nil
	case reconcile && s.ReconcileClient != nil:
		return s.ReconcileClient, nil
	case reconcile:
		return NewProviderClient(DefaultReconcileAttempts)
	}
	return NewProviderClient(DefaultRequestAttempts)
}

// chargeOnce sends one charge (with idemclient's own retries) and
// classifies the answer (answer.go). A transport error has class 0: the
// connection failed or the answer was lost (idemclient's AttemptFunc
// reported it); an answer whose body was cut off is classLost.
func (s *ProviderService) chargeOnce(ctx context.Context, client *http.Client, body []byte) (string, answerClass, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return "", 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		// The answer was cut off: whatever it said is lost.
		return "", classLost, fmt.Errorf("provider answered %d and its body was cut off: %w", resp.StatusCode, err)
	}
	class, id, refusal, desc := classify(resp.StatusCode, raw)
	switch class {
	case classCreated:
		return id, class, nil
	case classDeclined:
		return "", class, refusal
	}
	return "", class, fmt.Errorf("provider answered %s", desc)
}
