// Command chi is the orders service on chi (github.com/go-chi/chi/v5) with
// idem's net/http middleware and sqlitestore: POST /orders creates an order
// in the same SQLite transaction as its idempotency record. chi needs no
// adapter: idem's middleware is a func(http.Handler) http.Handler, and chi
// sets http.Request.Pattern, so the operation that names a record is the
// route template ("POST /orders"), as on a ServeMux.
//
//	go run ./chi -db orders.db
//	curl -i -X POST localhost:8094/orders -H 'Idempotency-Key: "o-1"' \
//	  -H 'Content-Type: application/json' -d '{"item":"book","quantity":1}'
package main

import (
	"encoding/json"
	"io"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/idemhq/idem/examples/internal/orders"
	"github.com/idemhq/idem/sqlitestore"
)

func main() { orders.Main("127.0.0.1:8094", newHandler) }

func newHandler(store *sqlitestore.Store) (http.Handler, error) {
	mw, err := orders.Middleware(store)
	if err != nil {
		return nil, err
	}
	r := chi.NewRouter()
	r.Use(middleware.Recoverer)
	// With (or Use inside a Group) runs idem after routing, where the
	// route's pattern is known; a Use on the root router runs before it.
	r.With(mw.Handle).Post("/orders", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body) // idem has read and bounded it already
		req, err := orders.Parse(body)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		// The execution's transaction comes through the request context.
		o, err := orders.Create(r.Context(), req)
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "could not create the order"})
			return
		}
		writeJSON(w, http.StatusCreated, o)
	})
	return r, nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
