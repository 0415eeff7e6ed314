package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/cmd/idem/internal/console"
	"github.com/idemhq/idem/cmd/idem/internal/metrics"
	"github.com/idemhq/idem/cmd/idem/internal/payments"
	"github.com/idemhq/idem/idemstore"
)

const serveAbout = `Runs the payments demo: a retry-safe payments API. POST /api/payments needs
an Idempotency-Key; a retry replays the stored response byte for byte, a
duplicate of a running request gets 409 (or waits for it and replays, when
the claim is in the payment's transaction: --claim-in-tx), a reused key with
another payload gets 422. By default payments and idempotency records live in
one SQLite file and commit in one transaction, the key's claim included;
nothing else needs to be installed.

With --provider URL (see idem provider), each payment is made in three steps
that survive crashes: a pending payment, a charge at the provider with a key
derived from the client's key, then captured; a charge that cannot be made in
--provider-budget answers 503 idempotency.step_incomplete and the retry resumes.
A charge the provider declines (a 4xx) is final: the payment fails and the
client gets 402 payment.declined, stored and replayed. Pending payments are
resumed in the background (--reconcile-*) until they are held for an operator.

Endpoints: POST /api/payments, GET /api/payments/{id}, GET /api/payments/count,
GET /healthz, GET /readyz (every dependency answers within 1s, as JSON),
GET /metrics (Prometheus).`

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newFlags("serve", serveAbout, stdout, stderr)
	sf := f.serverFlags()
	db := f.String("db", "idem.db", "where payments (and by default idempotency records) live:\na SQLite file path, a postgres:// URL, or a mysql://USER[:PASS]@HOST[:PORT]/DB URL (MariaDB)")
	storeSpec := f.String("store", "", "where idempotency records live when not in --db: a redis:// URL,\na redis+cluster://host:port,host:port URL (a Redis Cluster), another\nSQLite path, postgres:// or mysql:// URL; default: the --db database, in the\nsame transaction as the payment")
	lease := f.Duration("lease", idem.DefaultLease, "how long a claim owns a key without renewal (renewed while the\noperation runs; a crashed worker's key is taken over after it)")
	ttl := f.Duration("ttl", idem.DefaultTTL, "how long a key's record and response are kept; retries within it replay")
	encFlags := f.encryptionFlags()
	opDelay := f.Duration("op-delay", 0, "make each payment wait this long before it commits, to make the\nin-flight window visible in demos and tests")
	claimInTx := f.Bool("claim-in-tx", true, "claim a new key inside the payment's transaction, so that a first\nexecution commits once (records in --db only; not with --op-delay or\n--provider, whose operations run outside the database)")
	ef := f.eventsFlags()
	pf := f.providerFlags()
	cf := f.serverConsoleFlags()
	if code, ok := f.parse(args); !ok {
		return code
	}
	if len(f.positional()) > 0 {
		return f.usageError("unexpected argument %q", f.positional()[0])
	}
	logger, err := newLogger(*sf.logFormat, stderr)
	if err != nil {
		return f.usageError("%v", err)
	}
	for _, c := range []struct {
		name      string
		d         time.Duration
		allowZero bool
	}{{"lease", *lease, false}, {"ttl", *ttl, false}, {"op-delay", *opDelay, true}, {"wait", *sf.wait, true}, {"cleanup-interval", *sf.cleanup, true}, {"shutdown-timeout", *sf.shutdown, false}, {"store-timeout", *sf.storeTimeout, false}} {
		if err := positiveDuration(c.name, c.d, c.allowZero); err != nil {
			return f.usageError("%v", err)
		}
	}
	if *lease < idem.MinLease {
		return f.usageError("--lease must be at least %v", idem.MinLease)
	}
	for _, c := range []struct {
		name string
		d    time.Duration
	}{{"lease", *lease}, {"ttl", *ttl}, {"wait", *sf.wait}, {"store-timeout", *sf.storeTimeout}} {
		if c.d > idem.MaxTTL {
			return f.usageError("--%s %v is longer than the maximum %v (10 years): an expiry further out overflows", c.name, c.d, idem.MaxTTL)
		}
	}
	if *ttl < *lease {
		return f.usageError("--ttl (%v) must not be shorter than --lease (%v)", *ttl, *lease)
	}
	consoleToken, err := cf.check("console-addr", *cf.addr, func(msg string) { logger.Warn(msg) })
	if err != nil {
		fmt.Fprintf(stderr, "idem serve: %v\n", err)
		return exitUsage
	}
	enc, encAttr, err := encFlags.load(logger, *ttl)
	if err != nil {
		fmt.Fprintf(stderr, "idem serve: %v\n", err)
		return exitCodeOf(err)
	}
	if k, err := backend.KindOf(*db); err != nil {
		return f.usageError("--db: %v", err)
	} else if k != backend.SQLite && k != backend.Postgres && k != backend.MySQL {
		return f.usageError("--db must be a SQLite file path, a postgres:// URL or a mysql:// URL (records can go to Redis with --store)")
	}
	if *storeSpec != "" {
		if _, err := backend.KindOf(*storeSpec); err != nil {
			return f.usageError("--store: %v", err)
		}
	}

	// Payments and records in one PostgreSQL database: the payment's
	// transaction commits synchronously after the claim and flushes it, so
	// the claim need not wait for its own flush.
	sameDB := *storeSpec == "" || *storeSpec == *db
	if err := ef.check(sameDB); err != nil {
		return f.usageError("%v", err)
	}
	if *ef.url != "" && *pf.url != "" {
		return f.usageError("--events and --provider cannot be combined yet (the provider flow does not add events)")
	}
	if err := pf.check(sameDB, *ttl); err != nil {
		return f.usageError("%v", err)
	}
	// ReadFirst: a PostgreSQL replay is one primary-key read (the claim
	// statement runs only for a key the read cannot answer).
	dbStore, err := backend.OpenWith(ctx, *db, backend.Options{AsyncClaim: sameDB, ReadFirst: true})
	if err != nil {
		logger.Error("cannot open the database", "db", *db, "error", err)
		return exitError
	}
	defer closeStore(dbStore, logger)
	records := dbStore
	if !sameDB {
		if records, err = backend.OpenWith(ctx, *storeSpec, backend.Options{ReadFirst: true}); err != nil {
			logger.Error("cannot open the records store", "store", *storeSpec, "error", err)
			return exitError
		}
		defer closeStore(records, logger)
	}
	var repo payments.Repo
	var evs eventsRun
	oneCommit := sameDB && *pf.url == ""
	switch {
	// A payment whose row and record commit in one transaction needs no
	// unique index on (tenant, idempotency_key); Migrate adds or drops
	// it. The provider flow keeps it: its pending row commits in a step
	// of its own, before the record completes, and the index keeps any
	// second run of that step from making a second payment.
	case dbStore.SQLite != nil:
		repo = payments.SQLiteRepo{Store: dbStore.SQLite, SameTx: oneCommit}
	case dbStore.MySQL != nil:
		repo = payments.MySQLRepo{DB: dbStore.MySQL, SameTx: oneCommit}
	default:
		repo = payments.PostgresRepo{Pool: dbStore.PG, SameTx: oneCommit}
	}
	if err := repo.Migrate(ctx); err != nil {
		logger.Error("cannot use the payments table", "error", err)
		return exitError
	}
	if sr, ok := repo.(payments.SQLiteRepo); ok {
		if sr, err = sr.Prepare(ctx); err != nil {
			logger.Error("cannot prepare the payments statements", "error", err)
			return exitError
		}
		defer sr.Close()
		repo = sr
	}

	// Payments and records in one database commit in one transaction: the
	// records store must offer it (idemstore.TxStore).
	_, transactional := records.Records.(idemstore.TxStore)
	if sameDB && !transactional {
		logger.Error("internal error: the records store cannot join the payments' transaction", "store", fmt.Sprintf("%T", records.Records))
		return exitError
	}
	mwStore := records.Records
	if !sameDB {
		mwStore = withoutTx(mwStore)
	}
	var psvc *payments.ProviderService
	var secret []byte
	if *pf.url != "" {
		if psvc, secret, err = setupProvider(ctx, pf, repo, logger); err != nil {
			logger.Error("cannot prepare the provider mode", "error", err)
			return exitError
		}
	}
	m := metrics.New()
	tel, err := startTelemetry(ctx, "idem-serve", string(records.Kind), logger)
	if err != nil {
		logger.Error("cannot set up OpenTelemetry export", "error", err)
		return exitError
	}
	defer tel.close(logger)
	idemCfg := &idem.Config{
		Lease:        *lease,
		TTL:          *ttl,
		StoreTimeout: *sf.storeTimeout,
		// Set-Cookie2 is Set-Cookie's obsolete twin: neither is replayed.
		ReplayDenyHeaders: []string{"Set-Cookie", "Set-Cookie2"},
		Wait:              *sf.wait,
		ProblemBaseURL:    *sf.problemBaseURL,
		TenantFunc:        payments.Tenant,
		FingerprintFunc:   payments.Fingerprint,
		MaxRequestBody:    payments.MaxBody,
		Observer:          tel.observer(m),
		Logger:            logger,
		Encryption:        enc,
		DeriveKeySecret:   secret,
		// A payment's effects are all in the database transaction: the
		// claim can be in it too. --op-delay stands for slow work outside
		// the database (and shows the in-flight 409), and the provider
		// flow calls another service between its steps: both keep claims
		// that commit on their own.
		ClaimInTx: *claimInTx && sameDB && *opDelay == 0 && psvc == nil,
	}
	mw, err := idem.NewMiddleware(mwStore, idemCfg)
	if err != nil {
		return f.usageError("%v", err)
	}
	svc := &payments.Service{Repo: repo, OpDelay: *opDelay, FailReference: *ef.failReference, Logger: logger}
	evctx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	if evs, err = ef.start(evctx, dbStore, *db, logger); err != nil {
		logger.Error("cannot set up the events", "error", err)
		return exitError
	}
	// The dispatcher stops after the last request, before the database
	// closes; a message it publishes but cannot mark is published again.
	defer func() { stopEvents(); evs.wait() }()
	svc.OnCreateFunc = evs.hook
	if err := m.Register(evs.collectors...); err != nil {
		logger.Error("cannot register the events metrics", "error", err)
		return exitError
	}
	create, get, count := http.HandlerFunc(svc.Create), http.HandlerFunc(svc.Get), http.HandlerFunc(svc.Count)
	var exec *idem.Executor
	if psvc != nil {
		create, get, count = psvc.Create, psvc.GetStep, psvc.Count
		// The reconciler's executor shares the records' settings, not the
		// middleware's HTTP ones.
		exec, err = idem.NewExecutor(mwStore, &idem.Config{Lease: idemCfg.Lease, TTL: idemCfg.TTL,
			StoreTimeout: idemCfg.StoreTimeout, Observer: idemCfg.Observer, Logger: idemCfg.Logger,
			Encryption: idemCfg.Encryption, DeriveKeySecret: idemCfg.DeriveKeySecret, ClaimInTx: idemCfg.ClaimInTx})
		if err != nil {
			return f.usageError("%v", err)
		}
		pm := m.Provider(payments.Answers(), payments.Outcomes())
		psvc.Observer = pm
		rctx, stopReconcile := context.WithCancel(ctx)
		defer stopReconcile()
		go reconcileLoop(rctx, exec, mwStore, psvc, pf, pm, logger)
	}
	postHandler := evs.after(mw.Handle(m.InFlight(create)))
	if psvc != nil {
		postHandler = crashAfterCapture(postHandler, psvc)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /api/payments", m.Instrument("POST /api/payments", postHandler))
	mux.Handle("GET /api/payments/count", m.Instrument("GET /api/payments/count", count))
	mux.Handle("GET /api/payments/{id}", m.Instrument("GET /api/payments/{id}", get))
	mux.Handle("GET /healthz", health(dbStore, records))
	mux.Handle("GET /readyz", newReadiness(logger, []string{*db, *storeSpec, *ef.url}, append(storeChecks(dbStore, records), evs.checks...)...))
	mux.Handle("GET /metrics", m.Handler())

	ln, err := net.Listen("tcp", *sf.addr)
	if err != nil {
		logger.Error("cannot listen", "addr", *sf.addr, "error", err)
		return exitError
	}
	if *cf.addr != "" {
		ccfg := console.Config{Store: records, Spec: cmp.Or(*storeSpec, *db), Outbox: evs.outbox, RetryNowFunc: evs.retryNow,
			Rates: m.Rates, Encryption: enc, ShowBody: *cf.showBody, Token: consoleToken, TTL: *ttl, Title: "idem serve", Logger: logger}
		if psvc != nil {
			ccfg.ReconcileFunc = consoleReconcile(exec, records.Records, enc, psvc, *pf.budget)
			ccfg.DeriveKeyFunc = func(scope, key, step string) string { return idem.DeriveKeyWith(secret, scope, key, step) }
			ccfg.StepNames = payments.StepNames
		}
		wait, err := serveConsole(ctx, ccfg, *cf.addr, consoleToken, logger, *sf.accessLog, *sf.shutdown)
		if err != nil {
			ln.Close()
			return exitError
		}
		defer wait()
	}
	var where string
	if records != dbStore {
		where = fmt.Sprintf("payments in %s; idempotency records in %s (no shared transaction)", dbStore.Where, records.Where)
	} else {
		where = fmt.Sprintf("payments and idempotency records in %s, committed in one transaction", dbStore.Where)
	}
	logger.Info("idem serve listening", "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String(),
		"data", where, "lease", *lease, "ttl", *ttl, "op_delay", *opDelay, "claim_in_tx", idemCfg.ClaimInTx, encAttr, "provider", *pf.url)

	cctx, stopCleanup := context.WithCancel(ctx)
	defer stopCleanup()
	go cleanupLoop(cctx, records.Records, *sf.cleanup, logger)

	if err := serveHTTP(ctx, ln, accessLog(logger, *sf.accessLog, tel.handler(mux, "idem serve")), logger, *opDelay, *sf.shutdown); err != nil {
		logger.Error("server stopped", "error", err)
		return exitError
	}
	logger.Info("stopped")
	return exitOK
}

// withoutTx hides a records store's transactional capability (keeping its
// Watcher, if it has one): when the records live in another database than
// the payments, the store's transaction must not reach the payment
// repository, which would write the payment into the records' database.
func withoutTx(s idemstore.Store) idemstore.Store {
	if w, ok := s.(idemstore.Watcher); ok {
		return struct {
			idemstore.Store
			idemstore.Watcher
		}{s, w}
	}
	return struct{ idemstore.Store }{s}
}
