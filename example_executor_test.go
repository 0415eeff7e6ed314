package idem_test

import (
	"context"
	"fmt"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

// Executor.Do gives code without net/http (a message consumer here) the
// same semantics as the middleware. A redelivered message replays the
// stored result, and the charge runs once.
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
	handle("msg-1", "99.00 USD") // the same id with another payload
	fmt.Println("charges:", charges)
	// Output:
	// charged replayed: false
	// charged replayed: true
	// error: idem: the key was already used with a different request
	// charges: 1
}
