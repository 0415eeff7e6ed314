package idemclient_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemclient"
	"github.com/idemhq/idem/memstore"
)

// A payments service behind idem's middleware loses its first response on
// the way back (the connection drops after the payment was made). The
// client retries with the key it generated and receives the stored response
// as a replay: one payment, one answer.
func Example() {
	store, _ := memstore.New(nil)
	mw, _ := idem.NewMiddleware(store, nil)
	payments := 0
	handler := mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payments++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`, payments)
	}))
	var lost atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if lost.CompareAndSwap(false, true) {
			// Run the payment, then drop the connection instead of answering.
			handler.ServeHTTP(httptest.NewRecorder(), r)
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		handler.ServeHTTP(w, r)
	}))
	defer srv.Close()

	client, _ := idemclient.NewClient(nil)
	resp, err := client.Post(srv.URL+"/payments", "application/json", strings.NewReader(`{"amount":2599}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	res, _ := idemclient.ResultOf(resp)
	fmt.Println(resp.StatusCode, string(body))
	fmt.Println("attempts:", res.Attempts, "replayed:", res.Replayed)
	fmt.Println("payments:", payments)
	// Output:
	// 201 {"id":"pay_1"}
	// attempts: 2 replayed: true
	// payments: 1
}

// A request the caller already gave a key keeps it on every attempt; here
// a gateway answers 503 once with Retry-After: 0.
func ExampleResultOf() {
	var keys []string
	failed := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		if !failed {
			failed = true
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	client, _ := idemclient.NewClient(nil)
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"sku":"A-1"}`))
	req.Header.Set("Idempotency-Key", `"order-1001"`)
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	res, _ := idemclient.ResultOf(resp)
	fmt.Printf("%d key=%s attempts=%d sent=%q\n", resp.StatusCode, res.Key, res.Attempts, keys)
	// Output:
	// 201 key=order-1001 attempts=2 sent=["\"order-1001\"" "\"order-1001\""]
}
