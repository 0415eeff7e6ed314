package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

// The middleware on the in-memory store: the retry of a completed request
// replays the stored response instead of running the handler again, and a
// reused key with another payload is refused.
func Example() {
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
		resp, err := http.DefaultClient.Do(req)
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
	send(`"order-1001"`, `{"currency":"USD", "amount":2599}`) // same request, reordered
	send(`"order-1001"`, `{"amount":9999,"currency":"USD"}`)  // same key, other payload
	fmt.Println("payments:", payments)
	// Output:
	// 201 false {"id":"pay_1"}
	// 201 true {"id":"pay_1"}
	// 422 application/problem+json idempotency.key_reused
	// payments: 1
}

// Executor.Do gives non-HTTP code (a message consumer here) the same
// at-most-once semantics.
func ExampleExecutor_Do() {
	store, _ := memstore.New(nil)
	exec, _ := idem.NewExecutor(store, nil)

	charges := 0
	handle := func(messageID, payload string) {
		fp, _ := idem.Fingerprint(idem.FingerprintInput{Method: "CONSUME", Operation: "charge", Body: []byte(payload)})
		res, err := exec.Do(context.Background(), idem.DoParams{
			Scope: idem.Scope("billing", "charge"), Key: messageID, Fingerprint: fp,
		}, func(ctx context.Context) (*idem.Response, error) {
			charges++
			return &idem.Response{StatusCode: 200, Body: []byte("charged")}, nil
		})
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Println(string(res.Response.Body), "replayed:", res.Replayed)
	}
	handle("msg-1", "25.00 USD")
	handle("msg-1", "25.00 USD") // redelivered
	fmt.Println("charges:", charges)
	// Output:
	// charged replayed: false
	// charged replayed: true
	// charges: 1
}

// An operation in steps: the first step's write commits with its recovery
// point; the second calls a provider with a key derived for the step and
// the execution's fencing token. If the second step fails, the record stays
// at the recovery point, and the next attempt with the same key resumes
// there instead of repeating the first step.
func ExampleStep() {
	store, _ := memstore.New(nil)
	exec, _ := idem.NewExecutor(store, &idem.Config{DeriveKeySecret: []byte("a per-deployment secret, 32 bytes")})
	params := idem.DoParams{Scope: idem.Scope("tenant-1", "charge"), Key: "order-42", Fingerprint: "v1:example"}
	providerDown := true
	op := func(ctx context.Context) (*idem.Response, error) {
		id, err := idem.Step(ctx, "order", func(context.Context) ([]byte, error) {
			fmt.Println("order stored")
			return []byte("ord_1"), nil
		})
		if err != nil {
			return nil, err
		}
		_, err = idem.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
			key, _ := idem.DeriveKey(ctx, "charge") // the provider's Idempotency-Key
			info, _ := idem.InfoFromContext(ctx)
			fence := info.Fence // for a downstream that checks fences
			if providerDown {
				return nil, errors.New("provider unavailable")
			}
			fmt.Println("charged with a derived key:", strings.HasPrefix(key, "idem-"), "fence > 0:", fence > 0)
			return []byte("ch_1"), nil
		})
		if err != nil {
			return nil, err
		}
		return &idem.Response{StatusCode: 201, Body: id}, nil
	}
	res, err := exec.Do(context.Background(), params, op)
	fmt.Println("first attempt:", err, "suspended:", res.Suspended)
	providerDown = false
	res, err = exec.Do(context.Background(), params, op)
	fmt.Println("retry:", err, res.Response.StatusCode, string(res.Response.Body))
	// Output:
	// order stored
	// first attempt: provider unavailable suspended: true
	// charged with a derived key: true fence > 0: true
	// retry: <nil> 201 ord_1
}
