package idem_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

func TestKeyHeader(t *testing.T) {
	t.Parallel()
	store, _ := memstore.New(nil)
	if _, err := idem.NewMiddleware(store, &idem.Config{KeyHeader: "bad header"}); err == nil {
		t.Fatal("NewMiddleware accepted a KeyHeader that is not a field name")
	}
	mw, err := idem.NewMiddleware(store, &idem.Config{KeyHeader: "x-github-delivery", Requirement: idem.KeyOptional})
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		fmt.Fprint(w, runs)
	})))
	defer srv.Close()
	send := func(hdr, value string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("{}"))
		req.Header.Set(hdr, value)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for i := range 2 {
		resp, body := send("X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
		if resp.StatusCode != 200 || body != "1" || resp.Header.Get("X-Github-Delivery") != `"72d3162e-cc78-11e3-81ab-4c9367dc0958"` {
			t.Fatalf("delivery %d: %d %q, echo %q", i, resp.StatusCode, body, resp.Header.Get("X-Github-Delivery"))
		}
	}
	// The Idempotency-Key field is not the key on this route: with the
	// key optional, such a request is not deduplicated.
	for range 2 {
		send("Idempotency-Key", "k")
	}
	if runs != 3 {
		t.Fatalf("handler ran %d times, want 3", runs)
	}
	resp, body := send("X-GitHub-Delivery", "two, values")
	var p struct{ Code, Title string }
	_ = json.Unmarshal([]byte(body), &p)
	if resp.StatusCode != 400 || p.Code != idem.CodeKeyInvalid || !strings.Contains(p.Title, "X-Github-Delivery") {
		t.Fatalf("invalid id: %d %+v", resp.StatusCode, p)
	}
}
