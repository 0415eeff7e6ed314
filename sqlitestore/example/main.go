// Command example is a complete service on sqlitestore: a POST that
// inserts an order in the same transaction as its idempotency record.
//
//	go run ./example -db orders.db
//	curl -i -X POST localhost:8090/orders -H 'Idempotency-Key: "o-1"' -d '{"item":"book"}'
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os/signal"
	"syscall"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/sqlitestore"
)

func main() {
	db := flag.String("db", "orders.db", "SQLite file")
	addr := flag.String("addr", "127.0.0.1:8090", "listen address")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	store, err := sqlitestore.Open(ctx, *db, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	// The application's own table lives in the same file.
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id INTEGER PRIMARY KEY, item TEXT NOT NULL, created_at TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	mw, err := idem.NewMiddleware(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Item string }
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Item == "" {
			http.Error(w, `{"error":"send {\"item\":\"...\"}"}`, http.StatusBadRequest)
			return
		}
		// Slow, non-database work goes here, before the transaction.
		tx, err := sqlitestore.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		res, err := tx.ExecContext(r.Context(), `INSERT INTO orders (item, created_at) VALUES (?, ?)`,
			in.Item, time.Now().UTC().Format(time.RFC3339Nano))
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable) // rolled back, key released
			return
		}
		id, _ := res.LastInsertId()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated) // committed together with the stored response
		fmt.Fprintf(w, `{"id":%d,"item":%q}`+"\n", id, in.Item)
	})))

	// Expired records are deleted by the application, in batches.
	go func() {
		for range time.Tick(time.Minute) {
			_, _ = store.DeleteExpired(ctx, idemstore.DeleteExpiredParams{Limit: 1000, Now: time.Now()})
		}
	}()

	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	log.Printf("listening on http://%s, data in %s", *addr, *db)
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
