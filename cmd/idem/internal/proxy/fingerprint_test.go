package proxy

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/idemhq/idem"
)

func TestFingerprintFieldsPerRoute(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	file, err := ParseFile("routes.yaml", []byte(`
routes:
  "POST /orders":
    fingerprint_exclude: [/client_time, /trace/id]
  "POST /refunds":
    fingerprint_include: [/order, /amount]
`), DefaultSettings())
	if err != nil {
		t.Fatal(err)
	}
	px := newTestProxy(t, up, Config{Routes: file.ProxyRoutes()})
	post := func(path, key, body string) reply {
		return send(t, http.MethodPost, px.URL+path, body, idem.HeaderKey, key, "Content-Type", "application/json")
	}
	k1 := newKey(t)
	post("/orders", k1, `{"item":"a","client_time":"1","trace":{"id":"x"}}`)
	if r := post("/orders", k1, `{"item":"a","client_time":"2","trace":{"id":"y"}}`); r.status != 201 || r.header.Get(idem.HeaderReplayed) != "true" {
		t.Errorf("excluded fields differ: %v", r)
	}
	if r := post("/orders", k1, `{"item":"b","client_time":"1","trace":{"id":"x"}}`); r.status != 422 {
		t.Errorf("another item: %v", r)
	}
	k2 := newKey(t)
	post("/refunds", k2, `{"order":"o1","amount":5,"reason":"broken"}`)
	if r := post("/refunds", k2, `{"amount":5,"order":"o1","reason":"late"}`); r.status != 201 || r.header.Get(idem.HeaderReplayed) != "true" {
		t.Errorf("a field outside the include list differs: %v", r)
	}
	if r := post("/refunds", k2, `{"order":"o1","amount":6,"reason":"broken"}`); r.status != 422 {
		t.Errorf("another amount: %v", r)
	}
	// Routes without the setting fingerprint the whole body.
	k3 := newKey(t)
	post("/other", k3, `{"a":1,"client_time":"1"}`)
	if r := post("/other", k3, `{"a":1,"client_time":"2"}`); r.status != 422 {
		t.Errorf("default route: %v", r)
	}
}

func TestFingerprintFieldsConfigErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ yaml, want string }{
		{"routes:\n  \"POST /a\":\n    fingerprint_exclude: [client_time]\n", `3:5: route "POST /a": "client_time" is not a JSON Pointer`},
		{"routes:\n  \"POST /a\":\n    fingerprint_exclude: [/a]\n    fingerprint_include: [/b]\n", `set fingerprint_include or fingerprint_exclude, not both`},
		{"routes:\n  \"POST /a\":\n    fingerprint_exclude: /a\n", `fingerprint_exclude: expected a list`},
	} {
		_, err := ParseFile("f.yaml", []byte(c.yaml), DefaultSettings())
		var ce *ConfigErrors
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.yaml, err, c.want)
		}
	}
}
