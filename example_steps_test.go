package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

// An operation in two steps: store the order, then charge it at a card
// provider. The provider deduplicates on its own Idempotency-Key, and the
// charge step sends it a key derived with DeriveKey.
//
// The first attempt loses the provider's answer after the charge was made.
// The step reports ErrOutcomeUnknown, and the record keeps its recovery
// point. The retry with the same client key skips the order step, sends the
// provider the same derived key, and gets the same charge back: the card is
// charged once.
func ExampleStep() {
	charges := map[string]string{} // the provider's own idempotency records
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		if _, ok := charges[key]; !ok {
			charges[key] = fmt.Sprintf("ch_%d", len(charges)+1)
		}
		io.WriteString(w, charges[key])
	}))
	defer provider.Close()

	store, _ := memstore.New(nil)
	exec, _ := idem.NewExecutor(store, &idem.Config{DeriveKeySecret: []byte("a per-deployment secret, 32 bytes")})
	params := idem.DoParams{Scope: idem.Scope("tenant-1", "checkout"), Key: "order-42", Fingerprint: "v1:example"}

	connectionLost := true
	op := func(ctx context.Context) (*idem.Response, error) {
		order, err := idem.Step(ctx, "order", func(context.Context) ([]byte, error) {
			fmt.Println("order stored")
			return []byte("ord_1"), nil
		})
		if err != nil {
			return nil, err
		}
		charge, err := idem.Step(ctx, "charge", func(ctx context.Context) ([]byte, error) {
			key, err := idem.DeriveKey(ctx, "charge")
			if err != nil {
				return nil, err
			}
			req, _ := http.NewRequestWithContext(ctx, "POST", provider.URL, strings.NewReader(`{"amount":2599}`))
			req.Header.Set("Idempotency-Key", key)
			resp, err := provider.Client().Do(req)
			if err != nil {
				return nil, fmt.Errorf("%w: %v", idem.ErrOutcomeUnknown, err)
			}
			defer resp.Body.Close()
			id, err := io.ReadAll(resp.Body)
			if err != nil || connectionLost {
				return nil, fmt.Errorf("%w: the connection broke before the answer", idem.ErrOutcomeUnknown)
			}
			return id, nil
		})
		if err != nil {
			return nil, err
		}
		return &idem.Response{StatusCode: 201, Body: fmt.Appendf(nil, "%s paid by %s", order, charge)}, nil
	}

	res, err := exec.Do(context.Background(), params, op)
	fmt.Println("first attempt:", errors.Is(err, idem.ErrOutcomeUnknown), "suspended:", res.Suspended)
	connectionLost = false
	res, err = exec.Do(context.Background(), params, op)
	fmt.Println("retry:", err, res.Response.StatusCode, string(res.Response.Body))
	fmt.Println("charges at the provider:", len(charges))
	// Output:
	// order stored
	// first attempt: true suspended: true
	// retry: <nil> 201 ord_1 paid by ch_1
	// charges at the provider: 1
}

// A derived key is the same in every process and after every restart: a
// reconciler outside the execution computes the key the operation sent, to
// look the charge up at the provider. It starts with "idem-", reveals
// nothing of the client's key, and differs for every step.
func ExampleDeriveKeyWith() {
	secret := []byte("a per-deployment secret, 32 bytes")
	key := idem.DeriveKeyWith(secret, idem.Scope("tenant-1", "checkout"), "order-42", "charge")
	fmt.Println(key)
	fmt.Println(len(key), key == idem.DeriveKeyWith(secret, idem.Scope("tenant-1", "checkout"), "order-42", "refund"))
	// Output:
	// idem-6XnLcy9dDBycD2m9Qk-Hkhcky4IlSI_z8bH4pJA-a9s
	// 48 false
}
