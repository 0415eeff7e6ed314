package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/metrics"
	"github.com/idemhq/idem/cmd/idem/internal/payments"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
)

// crashEnv names a step boundary at which `idem serve --provider` kills
// itself with SIGKILL, once: a test hook for the crash tests (see
// docs/development.md). It is read from the environment only, never a
// flag, so that it cannot be set by accident in a command line.
const crashEnv = "IDEM_TEST_CRASH_AT"

// providerFlags are the flags of serve's provider mode.
type providerFlags struct {
	url         *string
	reconcile   *time.Duration
	budget      *time.Duration
	concurrency *int
	maxAttempts *int
	maxAge      *time.Duration
}

// Defaults and bounds of the reconciler's flags.
const (
	defaultReconcileConcurrency = 16
	maxReconcileConcurrency     = 1000
	defaultReconcileMaxAttempts = 100
	defaultReconcileMaxAge      = time.Hour
	// reconcileBatch bounds the payments one pass resumes; the next pass
	// goes on where it stopped (the oldest first).
	reconcileBatch = 500
	// heldCountLimit bounds the held payments a pass counts for
	// idem_reconcile_held.
	heldCountLimit = 1000
	// heldCountTimeout bounds that count.
	heldCountTimeout = 5 * time.Second
)

func (f *flags) providerFlags() providerFlags {
	return providerFlags{
		url: f.String("provider", "", "charge each payment at this card provider (e.g. http://127.0.0.1:8081,\n"+
			"see idem provider): a pending payment, a charge with a derived key,\nthen captured; default: no provider"),
		reconcile: f.Duration("reconcile-interval", 30*time.Second, "with --provider, how often pending payments are completed in the\nbackground with the same derived keys (0 disables)"),
		budget:    f.Duration("provider-budget", payments.DefaultProviderBudget, "with --provider, how long one request keeps retrying the charge\nbefore answering 503 idempotency.step_incomplete"),
		concurrency: f.Int("reconcile-concurrency", defaultReconcileConcurrency, fmt.Sprintf(
			"with --provider, how many pending payments the reconciler resumes at\nonce, so that a slow one holds up only its own slot (1 to %d)", maxReconcileConcurrency)),
		maxAttempts: f.Int("reconcile-max-attempts", defaultReconcileMaxAttempts, "with --provider, hold a pending payment for an operator once this\n"+
			"many attempts (the client's included) ended without an outcome: the\nreconciler stops resuming it (idem ls shows it held); 0: no limit"),
		maxAge: f.Duration("reconcile-max-age", defaultReconcileMaxAge, "with --provider, hold a pending payment for an operator once it is\n"+
			"this old; shorter than --ttl, after which its record is gone; 0: no\nlimit"),
	}
}

// check validates the provider flags; sameDB tells whether the records live
// in the payments' database, which recovery points need, and ttl is the
// records' retention, which a reconciliation's age must stay within.
func (pf providerFlags) check(sameDB bool, ttl time.Duration) error {
	if err := positiveDuration("reconcile-interval", *pf.reconcile, true); err != nil {
		return err
	}
	if err := positiveDuration("provider-budget", *pf.budget, false); err != nil {
		return err
	}
	if err := positiveDuration("reconcile-max-age", *pf.maxAge, true); err != nil {
		return err
	}
	if *pf.concurrency < 1 || *pf.concurrency > maxReconcileConcurrency {
		return fmt.Errorf("--reconcile-concurrency must be between 1 and %d, not %d", maxReconcileConcurrency, *pf.concurrency)
	}
	if *pf.maxAttempts < 0 {
		return fmt.Errorf("--reconcile-max-attempts must be 0 (no limit) or positive, not %d", *pf.maxAttempts)
	}
	if *pf.url == "" {
		return nil
	}
	if *pf.maxAge >= ttl {
		return fmt.Errorf("--reconcile-max-age (%v) must be shorter than --ttl (%v): a payment's record ends with its TTL, "+
			"and a payment the reconciler gives up on must stay visible to an operator until then (0: no age limit)", *pf.maxAge, ttl)
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
	client, err := payments.NewProviderClient(payments.DefaultRequestAttempts)
	if err != nil {
		return nil, nil, err
	}
	rclient, err := payments.NewProviderClient(payments.DefaultReconcileAttempts)
	if err != nil {
		return nil, nil, err
	}
	svc := &payments.ProviderService{Repo: sr, URL: *pf.url, Client: client, ReconcileClient: rclient, Budget: *pf.budget,
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
// stopped after a recovery point and that no client retried: at most
// reconcileBatch a pass, the oldest first, --reconcile-concurrency at a
// time. It holds for an operator the payments that reach
// --reconcile-max-attempts or --reconcile-max-age, and counts those held
// for idem_reconcile_held.
func reconcileLoop(ctx context.Context, exec *idem.Executor, store idemstore.Store, svc *payments.ProviderService, pf providerFlags, pm *metrics.Provider, logger *slog.Logger) {
	every := *pf.reconcile
	if every <= 0 {
		return
	}
	ss, _ := store.(idemstore.StepStore) // --provider needs the records in --db: a StepStore
	params := idem.ReconcileParams{Operation: "POST /api/payments (reconcile)", Limit: reconcileBatch,
		Concurrency: *pf.concurrency, MaxAttempts: *pf.maxAttempts, MaxAge: *pf.maxAge}
	logger.Info("reconciler started", "interval", every, "concurrency", params.Concurrency,
		"max_attempts", params.MaxAttempts, "max_age", params.MaxAge)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		reconcilePass(ctx, exec, ss, svc, params, pm, logger)
	}
}

// consoleReconcile returns the console's "reconcile now" of one suspended
// payment: what the reconciler does for each stuck record
// (idem.Executor.Reconcile), for the one the operator chose. It refuses a
// record that is not suspended (in flight, with a recovery point, its
// lease ended) and reports an operation that ended without an outcome
// again (the provider still failing). The operation gets the provider
// budget and a margin.
func consoleReconcile(exec *idem.Executor, records idemstore.Store, enc *idemcrypt.Encryption, svc *payments.ProviderService, budget time.Duration) func(ctx context.Context, scope, key string) error {
	return func(ctx context.Context, scope, key string) error {
		in, ok := records.(idemstore.Inspector)
		if !ok {
			return errors.New("the records store cannot be inspected")
		}
		ctx, cancel := context.WithTimeout(ctx, budget+30*time.Second)
		defer cancel()
		ri, err := in.Get(ctx, idemstore.GetParams{Scope: scope, Key: key, Now: time.Now()})
		if err != nil {
			return err
		}
		if ri.State != idemstore.StateInFlight || len(ri.Checkpoint) == 0 || ri.LeaseExpiresAt.After(time.Now()) {
			return fmt.Errorf("%w: the record is not suspended after a step", idem.ErrInFlight)
		}
		cp, err := enc.OpenCheckpoint(ctx, scope, key, ri.Fingerprint, ri.Checkpoint)
		if err != nil {
			return err
		}
		op, err := svc.Resume(ctx, idemstore.StuckRecord{Scope: scope, Key: key, Fingerprint: ri.Fingerprint, Checkpoint: cp, LeaseExpiresAt: ri.LeaseExpiresAt})
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

// reconcilePass is one pass of reconcileLoop. The metrics are updated at
// its end, the pass counter last.
func reconcilePass(ctx context.Context, exec *idem.Executor, ss idemstore.StepStore, svc *payments.ProviderService, params idem.ReconcileParams, pm *metrics.Provider, logger *slog.Logger) {
	res, err := exec.Reconcile(ctx, params, svc.Resume)
	defer pm.Reconciled(res.Completed, res.Failed-res.Held, res.Held)
	if res.Found > 0 || err != nil {
		logger.Info("reconciled pending payments", "found", res.Found, "completed", res.Completed, "failed", res.Failed,
			"held", res.Held, "error", err)
	}
	if ss == nil || ctx.Err() != nil {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, heldCountTimeout)
	held, err := ss.Stuck(sctx, idemstore.StuckParams{Limit: heldCountLimit, Held: true, Now: time.Now()})
	cancel()
	if err != nil {
		logger.Warn("cannot count the payments held for an operator", "error", err)
		return
	}
	pm.SetHeld(len(held))
	if res.Held > 0 {
		logger.Warn("payments held for an operator: the reconciler no longer resumes them; see idem ls (state held)",
			"held_by_this_pass", res.Held, "held_in_total", countText(len(held), heldCountLimit))
	}
}

// countText is n, or "at least n" when n reached the limit it was counted
// up to.
func countText(n, limit int) string {
	if n >= limit {
		return fmt.Sprintf("at least %d", n)
	}
	return strconv.Itoa(n)
}
