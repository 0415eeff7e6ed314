package idemclient_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemclient"
	"github.com/idemhq/idem/memstore"
)

// A key carried by the context is sent on every attempt instead of a
// random one; inside an idem execution, WithDerivedKey sends the key
// derived for the step.
func TestWithKeyAndWithDerivedKey(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get(idem.HeaderKey))
		n := len(keys)
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable) // one retry
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	client, err := idemclient.NewClient(&idemclient.Config{BackoffBase: 1, BackoffCap: 1})
	if err != nil {
		t.Fatal(err)
	}
	post := func(ctx context.Context) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("{}"))
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	post(idemclient.WithKey(t.Context(), "order-42"))
	if len(keys) != 2 || keys[0] != `"order-42"` || keys[1] != keys[0] {
		t.Fatalf("keys sent = %q, want \"order-42\" twice", keys)
	}

	store, _ := memstore.New(nil)
	exec, _ := idem.NewExecutor(store, nil)
	var want string
	_, err = exec.Do(t.Context(), idem.DoParams{Scope: "s", Key: "client-key", Fingerprint: "v1:x"}, func(ctx context.Context) (*idem.Response, error) {
		want, _ = idem.DeriveKey(ctx, "charge")
		dctx, err := idemclient.WithDerivedKey(ctx, "charge")
		if err != nil {
			return nil, err
		}
		post(dctx)
		return &idem.Response{StatusCode: 200}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Trim(keys[len(keys)-1], `"`); got != want || strings.Contains(got, "client-key") {
		t.Errorf("derived key sent = %q, want %q", got, want)
	}
	if _, err := idemclient.WithDerivedKey(t.Context(), "charge"); !errors.Is(err, idem.ErrNoExecution) {
		t.Errorf("WithDerivedKey outside an execution: %v", err)
	}
}
