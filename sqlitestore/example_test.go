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

// The order and the stored response commit in one transaction: a retry
// replays the response and inserts nothing.
func Example() {
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

	mw, _ := idem.NewMiddleware(store, nil)
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := sqlitestore.Tx(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		res, err := tx.Exec(`INSERT INTO orders (item) VALUES ('book')`)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		id, _ := res.LastInsertId()
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d", id)
	})))
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", `"order-1"`)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotency-Replayed"), string(body))
	}
	var n int
	store.ReadDB().QueryRow(`SELECT COUNT(*) FROM orders`).Scan(&n)
	fmt.Println("orders:", n)
	// Output:
	// 201 false order 1
	// 201 true order 1
	// orders: 1
}
