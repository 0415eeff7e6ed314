// Command nethttp is an orders service on net/http and sqlitestore: POST
// /orders creates an order in the same SQLite transaction as its
// idempotency record.
//
//	go run ./nethttp -db orders.db
//	curl -i -X POST localhost:8091/orders -H 'Idempotency-Key: "o-1"' \
//	  -H 'Content-Type: application/json' -d '{"item":"book","quantity":1}'
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/examples/internal/orders"
	"github.com/idemhq/idem/sqlitestore"
)

func main() {
	db := flag.String("db", "orders.db", "SQLite file for records and orders")
	addr := flag.String("addr", "127.0.0.1:8091", "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	store, err := orders.Open(ctx, *db)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	h, err := newHandler(store)
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Shutdown(context.Background()) }()
	log.Printf("listening on http://%s", *addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

func newHandler(store *sqlitestore.Store) (http.Handler, error) {
	mw, err := idem.NewMiddleware(store, &idem.Config{
		TenantFunc: func(r *http.Request) (string, error) { return orders.Tenant(r.Header.Get("Authorization")), nil },
	})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body) // idem has read and bounded it already
		req, err := orders.Parse(body)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		o, err := orders.Create(r.Context(), req)
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "could not create the order"})
			return
		}
		writeJSON(w, http.StatusCreated, o)
	})))
	return mux, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
