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

// Clients that regenerate a field on every attempt (a timestamp, a trace
// id) would get 422 on their retries. Config.FingerprintExclude leaves that
// field out of the fingerprint, so such a retry replays. A change anywhere
// else is still another request.
func ExampleConfig_fingerprintExclude() {
	store, _ := memstore.New(nil)
	mw, _ := idem.NewMiddleware(store, &idem.Config{
		FingerprintExclude: []string{"/metadata/client_time"},
	})
	transfers := 0
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		transfers++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "transfer %d", transfers)
	})))
	defer srv.Close()

	send := func(body string) {
		req, _ := http.NewRequest("POST", srv.URL+"/transfers", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"tr-9"`)
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
			b = []byte(p.Code)
		}
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotency-Replayed"), string(b))
	}
	send(`{"amount":500,"metadata":{"client_time":"09:00:00"}}`)
	send(`{"amount":500,"metadata":{"client_time":"09:00:07"}}`) // the retry: a new client_time
	send(`{"amount":900,"metadata":{"client_time":"09:00:09"}}`) // another amount
	fmt.Println("transfers:", transfers)
	// Output:
	// 201 false transfer 1
	// 201 true transfer 1
	// 422 false idempotency.key_reused
	// transfers: 1
}

// Fingerprint is what the middleware compares a retry with. A JSON body is
// canonicalised first, so whitespace and the order of members do not
// matter; the value is stable across releases of one FingerprintVersion.
func ExampleFingerprint() {
	in := idem.FingerprintInput{
		Method: "POST", Operation: "POST /payments", Target: "/payments",
		ContentType: "application/json", Body: []byte(`{"amount":2599,"currency":"USD"}`),
	}
	a, _ := idem.Fingerprint(in)
	in.Body = []byte(`{ "currency": "USD", "amount": 2599 }`)
	b, _ := idem.Fingerprint(in)
	in.Body = []byte(`{"amount":2600,"currency":"USD"}`)
	c, _ := idem.Fingerprint(in)
	fmt.Println(a)
	fmt.Println(a == b, a == c)
	// Output:
	// v1:6d45237d37daff1ac6db956dafce1f5c63fb33eeb3422dd581709773b98724c9
	// true false
}
