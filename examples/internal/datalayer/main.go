package datalayer

import (
	"context"
	"errors"
	"flag"
	"log"
	"net/http"
	"os/signal"
	"syscall"
	"time"
)

// Main is the command line of every data-layer example: it reads -db (a
// SQLite path, sqlite:PATH, or a server URL of a backend in Backends) and
// -addr (defaulting to addr), opens the database and lib on it, serves
// POST /orders until SIGINT or SIGTERM, and exits on errors.
func Main(addr string, lib Library) {
	url := flag.String("db", "orders.db", "database: a SQLite file path, sqlite:PATH, or a server URL")
	listen := flag.String("addr", addr, "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	b, dsn, err := Parse(*url)
	if err != nil {
		log.Fatal(err)
	}
	db, err := b.Open(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	create, err := lib.Open(db)
	if err != nil {
		log.Fatal(err)
	}
	h, err := Handler(db, nil, create)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: *listen, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Shutdown(context.Background()) }()
	log.Printf("%s on %s: listening on http://%s", lib.Name, b.Name, *listen)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}
