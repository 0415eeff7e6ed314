package idem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

// An inbound webhook endpoint deduplicated on the sender's own message id:
// Standard Webhooks send it as webhook-id and retry with the same id, so a
// redelivered event is answered from the stored response instead of being
// processed again. (Verify the webhook's signature before the middleware,
// and scope by sender with TenantFunc: senders choose their ids.)
func ExampleConfig_keyHeader() {
	store, _ := memstore.New(nil)
	mw, _ := idem.NewMiddleware(store, &idem.Config{
		KeyHeader:  "webhook-id",
		TenantFunc: func(r *http.Request) (string, error) { return "sender:acme", nil },
	})
	processed := 0
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		processed++
		w.WriteHeader(http.StatusNoContent)
	})))
	defer srv.Close()

	deliver := func(id string) {
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader(`{"type":"invoice.paid","data":{"id":"in_1"}}`))
		req.Header.Set("Content-Type", "application/json")
		if id != "" {
			req.Header.Set("webhook-id", id)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotency-Replayed"))
	}
	deliver("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W")
	deliver("msg_2KWPBgLlAfxdpx2AI54pPJ85f4W") // the sender's retry
	deliver("")                                // no id: refused
	fmt.Println("processed:", processed)
	// Output:
	// 204 false
	// 204 true
	// 400 false
	// processed: 1
}
