// Command nethttp is an orders service on net/http and sqlitestore: POST
// /orders creates an order in the same SQLite transaction as its
// idempotency record.
//
//	go run ./nethttp -db orders.db
//	curl -i -X POST localhost:8091/orders -H 'Idempotency-Key: "o-1"' \
//	  -H 'Content-Type: application/json' -d '{"item":"book","quantity":1}'
package main

import (
	"encoding/json"
	"io"
	"net/http"

	"github.com/idemhq/idem/examples/internal/orders"
	"github.com/idemhq/idem/sqlitestore"
)

func main() { orders.Main("127.0.0.1:8091", newHandler) }

func newHandler(store *sqlitestore.Store) (http.Handler, error) {
	mw, err := orders.Middleware(store)
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
