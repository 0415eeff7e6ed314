package idem_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

// The middleware on the in-memory store. The retry of a completed request
// replays the stored response, and the handler does not run again. The same
// JSON with its members in another order is the same request. A reused key
// with another payload is refused with 422.
func ExampleMiddleware_Handle() {
	store, _ := memstore.New(nil)
	mw, _ := idem.NewMiddleware(store, nil)

	payments := 0
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payments++
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`, payments)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	send := func(key, body string) {
		req, _ := http.NewRequest("POST", srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 400 {
			var p struct{ Code string }
			json.Unmarshal(b, &p)
			fmt.Println(resp.StatusCode, resp.Header.Get("Content-Type"), p.Code)
			return
		}
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotency-Replayed"), string(b))
	}
	send(`"order-1001"`, `{"amount":2599,"currency":"USD"}`)
	send(`"order-1001"`, `{"currency":"USD", "amount":2599}`) // the same request, reordered
	send(`"order-1001"`, `{"amount":9999,"currency":"USD"}`)  // the same key, another payload
	send(`"order-1002"`, `{"amount":9999,"currency":"USD"}`)  // a new key
	fmt.Println("payments:", payments)
	// Output:
	// 201 false {"id":"pay_1"}
	// 201 true {"id":"pay_1"}
	// 422 application/problem+json idempotency.key_reused
	// 201 false {"id":"pay_2"}
	// payments: 2
}
