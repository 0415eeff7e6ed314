package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/cmd/idem/internal/metrics"
	"github.com/idemhq/idem/idemstore"
)

// Server timeouts. The write timeout leaves room for the handler's own
// time (an operation delay, an upstream's answer).
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 60 * time.Second
	idleTimeout       = 120 * time.Second
	// defaultShutdownTimeout is --shutdown-timeout's default.
	defaultShutdownTimeout = 30 * time.Second
	maxHeaderBytes         = 64 << 10
)

// serveHTTP runs h on ln until ctx ends, then shuts down gracefully: it
// stops accepting, lets in-flight requests finish (and complete their
// records) for up to grace, and returns. Requests still running then (a
// store that stopped answering, an upstream that never does) have their
// connections closed and are abandoned: the caller returns and the process
// exits. extraWrite is added to the write timeout.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler, logger *slog.Logger, extraWrite, grace time.Duration) error {
	return serveHTTPWith(ctx, ln, h, logger, extraWrite, grace, nil)
}

// serveHTTPWith is serveHTTP with a hook that, if set, adapts the server
// and its listener before serving and returns the listener to serve (the
// proxy's framing guard, proxy.GuardFraming).
func serveHTTPWith(ctx context.Context, ln net.Listener, h http.Handler, logger *slog.Logger, extraWrite, grace time.Duration,
	wrap func(*http.Server, net.Listener) net.Listener) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      readTimeout + extraWrite,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	if wrap != nil {
		ln = wrap(srv, ln)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	logger.Info("shutting down: waiting for in-flight requests", "timeout", grace)
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if err != nil {
		// The grace period passed: close every connection, which cancels
		// the requests' contexts, and stop waiting for their handlers.
		_ = srv.Close()
		err = fmt.Errorf("in-flight requests did not finish within the shutdown timeout (%v); abandoned them: %w", grace, err)
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// accessLog logs one line per request. The idempotency key is logged as a
// short hash, never in clear. With on false it returns next unchanged.
func accessLog(logger *slog.Logger, on bool, next http.Handler) http.Handler {
	if !on {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &metrics.StatusWriter{ResponseWriter: w}
		// Deferred, so that a request whose handler aborts (a panic, as
		// net/http's ErrAbortHandler) is logged too.
		defer func() { logRequest(logger, r, sw, start) }()
		next.ServeHTTP(sw, r)
	})
}

func logRequest(logger *slog.Logger, r *http.Request, sw *metrics.StatusWriter, start time.Time) {
	attrs := []slog.Attr{
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", sw.Status()),
		slog.Int64("bytes", sw.Bytes),
		slog.Duration("duration", time.Since(start)),
	}
	if vs := r.Header.Values(idem.HeaderKey); len(vs) > 0 {
		attrs = append(attrs, slog.String("key", logKey(vs)))
	}
	if rp := sw.Header().Get(idem.HeaderReplayed); rp != "" {
		attrs = append(attrs, slog.String("replayed", rp))
	}
	logger.LogAttrs(r.Context(), slog.LevelInfo, "request", attrs...)
}

// logKey redacts a request's Idempotency-Key fields for the access log as
// the core redacts keys in its own log lines (idem.RedactKey of the parsed
// key), so that one key has one hash in every line: "k" and k, which are
// one key, hash alike. A key that does not parse is hashed as sent.
func logKey(values []string) string {
	if key, err := idem.ParseKey(values); err == nil {
		return idem.RedactKey(key)
	}
	return idem.RedactKey(strings.Join(values, ", "))
}

// health answers 200 while every store answers a ping, 503 otherwise.
func health(stores ...*backend.Store) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		for _, s := range stores {
			if s == nil {
				continue
			}
			if err := s.Ping(ctx); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`{"status":"unavailable","store":"` + string(s.Kind) + `"}` + "\n"))
				return
			}
		}
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
}

// cleanupLoop deletes expired records every interval until ctx ends. It is
// the application's explicit cleanup: the stores never start goroutines.
func cleanupLoop(ctx context.Context, s idemstore.Store, every time.Duration, logger *slog.Logger) {
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
		n, err := deleteExpired(ctx, s, 1000, 0, true)
		if err != nil {
			logger.Warn("cleanup of expired records failed", "error", err)
		} else if n > 0 {
			logger.Info("deleted expired records", "count", n)
		}
	}
}

// cleanupBatchTimeout bounds one batch of deleteExpired.
const cleanupBatchTimeout = 30 * time.Second

// deleteExpired deletes expired records in batches of batch until a batch
// comes back short (or maxBatches, if positive, were run). With pace set it
// pauses after each batch as long as the batch took, so that traffic gets
// the store (SQLite has a single write lock) at least half of the time
// while a large backlog is deleted.
func deleteExpired(ctx context.Context, s idemstore.Store, batch, maxBatches int, pace bool) (int, error) {
	total := 0
	for i := 0; maxBatches <= 0 || i < maxBatches; i++ {
		start := time.Now()
		// The core bounds its own store calls; this one is the
		// application's, so it bounds it too: a store that stopped
		// answering must not hold a batch forever.
		bctx, cancel := context.WithTimeout(ctx, cleanupBatchTimeout)
		n, err := s.DeleteExpired(bctx, idemstore.DeleteExpiredParams{Limit: batch, Now: start})
		cancel()
		total += n
		if err != nil {
			return total, err
		}
		if n < batch {
			break
		}
		if pace {
			t := time.NewTimer(time.Since(start))
			select {
			case <-ctx.Done():
				t.Stop()
				return total, ctx.Err()
			case <-t.C:
			}
		}
	}
	return total, nil
}

// closeStore closes a store at exit, within a bound (see
// backend.Store.Close), and logs a failure.
func closeStore(s *backend.Store, logger *slog.Logger) {
	if err := s.Close(); err != nil {
		logger.Warn("closing the store", "error", err)
	}
}
