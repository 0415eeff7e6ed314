package orders

import (
	"context"
	"errors"
	"flag"
	"log"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/sqlitestore"
)

// Middleware returns idem's middleware over store, with one tenant per
// Authorization value (hashed by Tenant).
func Middleware(store *sqlitestore.Store) (*idem.Middleware, error) {
	return idem.NewMiddleware(store, &idem.Config{
		TenantFunc: func(r *http.Request) (string, error) { return Tenant(r.Header.Get("Authorization")), nil },
	})
}

// Main is the command line every HTTP example shares: it reads -db and
// -addr (defaulting to addr), opens the SQLite file, serves the handler
// newHandler builds on it until SIGINT or SIGTERM, and exits on errors.
func Main(addr string, newHandler func(*sqlitestore.Store) (http.Handler, error)) {
	db := flag.String("db", "orders.db", "SQLite file for records and orders")
	listen := flag.String("addr", addr, "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	store, err := Open(ctx, *db)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	h, err := newHandler(store)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: *listen, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Shutdown(context.Background()) }()
	log.Printf("listening on http://%s", *listen)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}
