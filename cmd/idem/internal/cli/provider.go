package cli

import (
	"context"
	"io"
	"net"
	"time"

	"github.com/idemhq/idem/cmd/idem/internal/provider"
	"github.com/idemhq/idem/sqlitestore"
)

const providerAbout = `Runs a card-provider simulator with faults, itself retry-safe with idem on
SQLite: the downstream system for "idem serve --provider URL".

POST /v1/charges needs an Idempotency-Key and {"amountCents":N,"currency":"USD",
"reference":"..."}; it answers 201 {"id":"ch_...",...}, and a retry with the
same key replays that answer. --fail-rate answers that fraction of charges 503
before anything is charged; --drop-rate commits that fraction and closes the
connection without an answer; --decline-rate declines that fraction of new
charges with 402 card_declined (stored: a retry with the same key is declined
again); --delay makes each charge take that long. Each injected fault is
logged, with the key redacted.

Endpoints: POST /v1/charges, GET /v1/charges/count, GET /v1/charges?reference=R,
GET /healthz.`

// defaultProviderCleanup is how often the provider deletes expired records.
const defaultProviderCleanup = time.Minute

func runProvider(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newFlags("provider", providerAbout, stdout, stderr)
	addr := f.String("addr", "127.0.0.1:8081", "address to listen on (host:port; port 0 picks a free port)")
	db := f.String("db", "provider.db", "the SQLite file holding the charges and their idempotency records")
	failRate := f.Float64("fail-rate", 0, "fraction of charges answered 503 before anything is charged (0 to 1)")
	dropRate := f.Float64("drop-rate", 0, "fraction of charges committed and then left without an answer\n(the connection is closed) (0 to 1)")
	declineRate := f.Float64("decline-rate", 0, "fraction of new charges declined with 402 card_declined, a final\nanswer stored with the key (0 to 1)")
	delay := f.Duration("delay", 0, "how long each charge takes")
	logFormat := f.String("log-format", "text", "log format: text or json")
	if code, ok := f.parse(args); !ok {
		return code
	}
	if len(f.positional()) > 0 {
		return f.usageError("unexpected argument %q", f.positional()[0])
	}
	for _, r := range []struct {
		name string
		v    float64
	}{{"fail-rate", *failRate}, {"drop-rate", *dropRate}, {"decline-rate", *declineRate}} {
		if !(r.v >= 0 && r.v <= 1) { // NaN too
			return f.usageError("--%s must be between 0 and 1, not %v", r.name, r.v)
		}
	}
	if err := positiveDuration("delay", *delay, true); err != nil {
		return f.usageError("%v", err)
	}
	logger, err := newLogger(*logFormat, stderr)
	if err != nil {
		return f.usageError("%v", err)
	}
	store, err := sqlitestore.Open(ctx, *db, nil)
	if err != nil {
		logger.Error("cannot open the database", "db", *db, "error", err)
		return exitError
	}
	defer store.Close()
	p, err := provider.New(ctx, store, provider.Config{FailRate: *failRate, DropRate: *dropRate, DeclineRate: *declineRate, Delay: *delay, Logger: logger})
	if err != nil {
		logger.Error("cannot start the provider", "error", err)
		return exitError
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		logger.Error("cannot listen", "addr", *addr, "error", err)
		return exitError
	}
	logger.Info("idem provider listening", "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String(),
		"db", *db, "fail_rate", *failRate, "drop_rate", *dropRate, "decline_rate", *declineRate, "delay", *delay)
	go cleanupLoop(ctx, store, defaultProviderCleanup, logger)
	if err := serveHTTP(ctx, ln, p.Handler(), logger, *delay, defaultShutdownTimeout); err != nil {
		logger.Error("server stopped", "error", err)
		return exitError
	}
	logger.Info("stopped")
	return exitOK
}
