package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
)

// Stored responses encrypted at rest. The store holds only ciphertext. A
// keyring that still holds the key replays the response; one without it
// answers 503 idempotency.record_unreadable, and the handler does not run
// again. (Real keys come from LoadKeyring or a KMS, never from the source.)
func ExampleConfig_encryption() {
	store, _ := memstore.New(nil)
	oldKey := idemcrypt.Key{ID: "2026-11", Key: bytes.Repeat([]byte{1}, 32)}
	newKey := idemcrypt.Key{ID: "2026-12", Key: bytes.Repeat([]byte{2}, 32)}

	runs := 0
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"card":"4242 4242 4242 4242","status":"saved"}`)
	})
	serve := func(keys ...idemcrypt.Key) *httptest.Server {
		keyring, _ := idemcrypt.NewKeyring(keys...) // newest last: it seals
		enc, _ := idemcrypt.New(keyring, nil)
		mw, _ := idem.NewMiddleware(store, &idem.Config{Encryption: enc})
		return httptest.NewServer(mw.Handle(handler))
	}
	send := func(srv *httptest.Server) {
		req, _ := http.NewRequest("POST", srv.URL+"/cards", strings.NewReader(`{"number":"4242 4242 4242 4242"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"card-1"`)
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

	before := serve(oldKey)
	defer before.Close()
	send(before)

	// What the store holds.
	ctx := context.Background()
	page, _ := store.List(ctx, idemstore.ListParams{Limit: 1, Now: time.Now()})
	rec, _ := store.Get(ctx, idemstore.GetParams{Scope: page.Records[0].Scope, Key: page.Records[0].Key, Now: time.Now()})
	fmt.Println("stored body shows the card:", bytes.Contains(rec.Response.Body, []byte("4242")))

	rotated := serve(oldKey, newKey) // rotation: the old key still opens old records
	defer rotated.Close()
	send(rotated)

	lost := serve(newKey) // the old key was removed too early
	defer lost.Close()
	send(lost)
	fmt.Println("handler runs:", runs)
	// Output:
	// 201 false {"card":"4242 4242 4242 4242","status":"saved"}
	// stored body shows the card: false
	// 201 true {"card":"4242 4242 4242 4242","status":"saved"}
	// 503 false idempotency.record_unreadable
	// handler runs: 1
}
