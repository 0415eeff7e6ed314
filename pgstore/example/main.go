// Command example is a payments API whose POST /payments is protected by
// idem on PostgreSQL: the payment row and the stored response commit in one
// transaction, and every instance started against the same database shares
// the idempotency records.
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test go run ./example
//	curl -i -X POST localhost:8080/payments -H 'Idempotency-Key: "k1"' \
//	     -H 'Content-Type: application/json' -d '{"amount":2599}'
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	// Creates schema "idem" and its table on first start; safe when many
	// instances start at once.
	store, err := pgstore.New(ctx, pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS payments (
		id bigserial PRIMARY KEY, amount integer NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		log.Fatal(err)
	}

	mw, err := idem.NewMiddleware(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handle(http.HandlerFunc(createPayment)))

	// Expired records behave as absent at once; this removes their rows.
	go func() {
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := deleteExpired(ctx, store); err != nil {
					log.Printf("idem cleanup: %v", err)
				}
			}
		}
	}()

	srv := &http.Server{Addr: ":8080", Handler: mux}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

func createPayment(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Amount int `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 {
		http.Error(w, "amount must be a positive integer", http.StatusBadRequest)
		return
	}
	// The execution's transaction: do not commit or roll it back here. It
	// commits with the stored response after this handler returns a
	// stored status (2xx, most 4xx), and rolls back on 5xx or a panic.
	tx, err := pgstore.Tx(r.Context())
	if err != nil {
		http.Error(w, "no transaction", http.StatusInternalServerError)
		return
	}
	var id int64
	if err := tx.QueryRow(r.Context(), "INSERT INTO payments (amount) VALUES ($1) RETURNING id", in.Amount).Scan(&id); err != nil {
		http.Error(w, "could not record the payment", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/payments/%d", id))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%d,"amount":%d}`+"\n", id, in.Amount)
}

// deleteExpired removes expired records in short batches.
func deleteExpired(ctx context.Context, store *pgstore.Store) error {
	const batch = 5000
	for {
		n, err := store.DeleteExpired(ctx, idemstore.DeleteExpiredParams{Limit: batch, Now: time.Now()})
		if err != nil || n < batch {
			return err
		}
	}
}
