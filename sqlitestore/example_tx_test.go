package sqlitestore_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/sqlitestore"
)

// The handler writes its order through the execution's transaction. The
// order commits with the stored response, or not at all.
//
// The first attempt inserts the order, then fails with 503: the insert
// rolls back, and the key is released. The retry runs the handler again and
// commits the order with its response. The next retry replays that response
// and inserts nothing.
func ExampleTx() {
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store, err := sqlitestore.Open(ctx, filepath.Join(dir, "app.db"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	store.DB().Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)`)

	warehouseDown := true
	mw, _ := idem.NewMiddleware(store, nil)
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := sqlitestore.Tx(r.Context())
		if err != nil {
			http.Error(w, "store unavailable", http.StatusServiceUnavailable)
			return
		}
		res, err := tx.Exec(`INSERT INTO orders (item) VALUES ('book')`)
		if err != nil {
			http.Error(w, "cannot store the order", http.StatusServiceUnavailable)
			return
		}
		if warehouseDown {
			http.Error(w, "warehouse unavailable", http.StatusServiceUnavailable) // rolls back
			return
		}
		id, _ := res.LastInsertId()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", id)
	})))
	defer srv.Close()

	orders := func() int {
		var n int
		store.ReadDB().QueryRow(`SELECT COUNT(*) FROM orders`).Scan(&n)
		return n
	}
	send := func() {
		req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"order-1"`)
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed: %s %s; orders: %d\n", resp.StatusCode, resp.Header.Get("Idempotency-Replayed"),
			strings.TrimSpace(string(body)), orders())
	}
	send()
	warehouseDown = false
	send()
	send()
	// Output:
	// 503 replayed: false warehouse unavailable; orders: 0
	// 201 replayed: false order 1; orders: 1
	// 201 replayed: true order 1; orders: 1
}
