package idem_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
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

// An operation whose provider was down stopped after its first step, and
// its client never retried. Executor.Reconcile finds it, runs it again
// through the function resume returns, and completes it. The completed step
// does not run again.
func ExampleExecutor_Reconcile() {
	store, _ := memstore.New(nil)
	exec, _ := idem.NewExecutor(store, nil)

	providerDown := true
	refund := func(ctx context.Context) (*idem.Response, error) {
		_, err := idem.Step(ctx, "ledger", func(context.Context) ([]byte, error) {
			fmt.Println("ledger entry written")
			return nil, nil
		})
		if err != nil {
			return nil, err
		}
		_, err = idem.Step(ctx, "provider", func(context.Context) ([]byte, error) {
			if providerDown {
				return nil, errors.New("provider unavailable")
			}
			fmt.Println("refund sent")
			return nil, nil
		})
		if err != nil {
			return nil, err
		}
		return &idem.Response{StatusCode: 200, Body: []byte("refunded")}, nil
	}
	res, err := exec.Do(context.Background(), idem.DoParams{
		Scope: idem.Scope("tenant-1", "refund"), Key: "refund-8", Fingerprint: "v1:example",
	}, refund)
	fmt.Println("client:", err, "suspended:", res.Suspended)

	providerDown = false
	// resume rebuilds the operation of a stuck record; here every record
	// is a refund.
	resume := func(ctx context.Context, rec idemstore.StuckRecord) (idem.Operation, error) {
		fmt.Println("resuming", rec.Key)
		return refund, nil
	}
	rr, err := exec.Reconcile(context.Background(), idem.ReconcileParams{}, resume)
	fmt.Printf("%+v %v\n", rr, err)
	rr, err = exec.Reconcile(context.Background(), idem.ReconcileParams{}, resume)
	fmt.Printf("%+v %v\n", rr, err)
	// Output:
	// ledger entry written
	// client: provider unavailable suspended: true
	// resuming refund-8
	// refund sent
	// {Found:1 Completed:1 Failed:0 Held:0} <nil>
	// {Found:0 Completed:0 Failed:0 Held:0} <nil>
}
