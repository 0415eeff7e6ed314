package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"syscall"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/payments"
)

// crashEnv names a step boundary at which `idem serve --provider` kills
// itself with SIGKILL, once: a test hook for the crash tests (see
// docs/development.md). It is read from the environment only, never a
// flag, so that it cannot be set by accident in a command line.
const crashEnv = "IDEM_TEST_CRASH_AT"

// providerFlags are the flags of serve's provider mode.
type providerFlags struct {
	url       *string
	reconcile *time.Duration
	budget    *time.Duration
}

func (f *flags) providerFlags() providerFlags {
	return providerFlags{
		url: f.String("provider", "", "charge each payment at this card provider (e.g. http://127.0.0.1:8081,\n"+
			"see idem provider): a pending payment, a charge with a derived key,\nthen captured; default: no provider"),
		reconcile: f.Duration("reconcile-interval", 30*time.Second, "with --provider, how often pending payments are completed in the\nbackground with the same derived keys (0 disables)"),
		budget:    f.Duration("provider-budget", payments.DefaultProviderBudget, "with --provider, how long one request keeps retrying the charge\nbefore answering 503 idempotency.step_incomplete"),
	}
}

// check validates the provider flags; sameDB tells whether the records live
// in the payments' database, which recovery points need.
func (pf providerFlags) check(sameDB bool) error {
	if err := positiveDuration("reconcile-interval", *pf.reconcile, true); err != nil {
		return err
	}
	if err := positiveDuration("provider-budget", *pf.budget, false); err != nil {
		return err
	}
	if *pf.url == "" {
		return nil
	}
	u, err := url.Parse(*pf.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--provider must be an http:// or https:// URL, not %q", *pf.url)
	}
	if !sameDB {
		return errors.New("--provider needs the idempotency records in the --db database (no --store): the payment's steps commit with their recovery points")
	}
	return nil
}

// setupProvider prepares the provider mode: the payments table's provider
// columns and the key-derivation secret kept in the database.
func setupProvider(ctx context.Context, pf providerFlags, repo payments.Repo, logger *slog.Logger) (*payments.ProviderService, []byte, error) {
	sr, ok := repo.(payments.StepRepo)
	if !ok {
		return nil, nil, fmt.Errorf("the payments repository %T cannot run steps", repo)
	}
	secret, err := sr.MigrateSteps(ctx)
	if err != nil {
		return nil, nil, err
	}
	client, err := payments.NewProviderClient()
	if err != nil {
		return nil, nil, err
	}
	svc := &payments.ProviderService{Repo: sr, URL: *pf.url, Client: client, Budget: *pf.budget,
		CrashAt: os.Getenv(crashEnv), Logger: logger}
	return svc, secret, nil
}

// crashAfterCapture kills the process when a created payment's answer is
// about to be sent, after its record completed: the last step boundary.
func crashAfterCapture(next http.Handler, svc *payments.ProviderService) http.Handler {
	if svc.CrashAt != "after-capture" {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&crashWriter{ResponseWriter: w}, r)
	})
}

type crashWriter struct{ http.ResponseWriter }

func (c *crashWriter) WriteHeader(status int) {
	if status == http.StatusCreated {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
	c.ResponseWriter.WriteHeader(status)
}

func (c *crashWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// reconcileLoop completes, every interval, the payments whose attempts
// stopped after a recovery point and that no client retried.
func reconcileLoop(ctx context.Context, exec *idem.Executor, svc *payments.ProviderService, every time.Duration, logger *slog.Logger) {
	if every <= 0 {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := exec.Reconcile(ctx, idem.ReconcileParams{Operation: "POST /api/payments (reconcile)"}, svc.Resume)
		if res.Found > 0 || err != nil {
			logger.Info("reconciled pending payments", "found", res.Found, "completed", res.Completed, "failed", res.Failed, "error", err)
		}
	}
}

// consoleReconcile returns the console's "reconcile now" of one suspended
// payment: what the reconciler does for each stuck record
// (idem.Executor.Reconcile), for the one the operator chose. It refuses a
// record that is not suspended (in flight, with a recovery point, its
// lease ended) and reports an operation that ended without an outcome
// again (the provider still failing). The operation gets the provider
// budget and a margin.
func consoleReconcile(exec *idem.Executor, records idem.Store, enc *idem.Encryption, svc *payments.ProviderService, budget time.Duration) func(ctx context.Context, scope, key string) error {
	return func(ctx context.Context, scope, key string) error {
		in, ok := records.(idem.Inspector)
		if !ok {
			return errors.New("the records store cannot be inspected")
		}
		ctx, cancel := context.WithTimeout(ctx, budget+30*time.Second)
		defer cancel()
		ri, err := in.Get(ctx, idem.GetParams{Scope: scope, Key: key, Now: time.Now()})
		if err != nil {
			return err
		}
		if ri.State != idem.StateInFlight || len(ri.Checkpoint) == 0 || ri.LeaseExpiresAt.After(time.Now()) {
			return fmt.Errorf("%w: the record is not suspended after a step", idem.ErrInFlight)
		}
		cp, err := enc.OpenCheckpoint(ctx, scope, key, ri.Fingerprint, ri.Checkpoint)
		if err != nil {
			return err
		}
		op, err := svc.Resume(ctx, idem.StuckRecord{Scope: scope, Key: key, Fingerprint: ri.Fingerprint, Checkpoint: cp, LeaseExpiresAt: ri.LeaseExpiresAt})
		if err != nil {
			return err
		}
		r, err := exec.Do(ctx, idem.DoParams{Scope: scope, Key: key, Fingerprint: ri.Fingerprint, Operation: "POST /api/payments (console reconcile)"}, op)
		if err != nil {
			return err
		}
		if r.Released || r.Suspended {
			return errors.New("the payment is still incomplete: the provider could not be charged within the budget; it stays suspended")
		}
		return nil
	}
}
