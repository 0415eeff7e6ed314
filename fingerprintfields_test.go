package idem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

// fieldServer is a handler behind a middleware with cfg, counting runs.
func fieldServer(t *testing.T, cfg *idem.Config) (string, *atomic.Int64) {
	t.Helper()
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	})))
	t.Cleanup(srv.Close)
	return srv.URL, &runs
}

func postJSON(t *testing.T, url, key, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestFingerprintFields(t *testing.T) {
	t.Parallel()
	type try struct {
		body string
		want int // 201 executed or replayed, 422 mismatch, 400 invalid
	}
	for _, c := range []struct {
		name  string
		cfg   idem.Config
		tries []try
		runs  int64
	}{
		{"exclude", idem.Config{FingerprintExclude: []string{"/client_time", "/items/0/note", "/absent/x"}}, []try{
			{`{"amount":100,"client_time":"10:00","items":[{"sku":"a","note":"x"}]}`, 201},
			{`{"client_time":"10:01","amount":100,"items":[{"note":"y","sku":"a"}]}`, 201}, // replay
			{`{"amount":100,"items":[{"sku":"a"}]}`, 201},                                  // replay: excluded member absent
			{`{"amount":101,"client_time":"10:00","items":[{"sku":"a","note":"x"}]}`, 422},
			{`{"amount":100,"client_time":"10:00","items":[{"sku":"b","note":"x"}]}`, 422},
		}, 1},
		{"exact numbers", idem.Config{FingerprintExclude: []string{"/t"}}, []try{
			{`{"n":9007199254740993,"t":1}`, 201},
			{`{"n":9007199254740992,"t":2}`, 422},
			{`{"n":9007199254740993.0,"t":3}`, 201}, // the same number, canonically
		}, 1},
		{"include", idem.Config{FingerprintInclude: []string{"/amount", "/currency"}}, []try{
			{`{"amount":100,"currency":"EUR","note":"a"}`, 201},
			{`{"currency":"EUR","amount":100,"note":"b","extra":[1]}`, 201},
			{`{"amount":100,"currency":"USD","note":"a"}`, 422},
			{`{"amount":100,"note":"a"}`, 422},                 // absent
			{`{"amount":100,"currency":null,"note":"a"}`, 422}, // null is not absent
		}, 1},
		{"strict JSON still", idem.Config{FingerprintExclude: []string{"/t"}}, []try{
			{`{"a":1,"a":2}`, 400},
			{`{"a":1`, 400},
		}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			url, runs := fieldServer(t, &c.cfg)
			for i, tr := range c.tries {
				if got := postJSON(t, url, "k", tr.body).StatusCode; got != tr.want {
					t.Errorf("try %d %s: %d, want %d", i, tr.body, got, tr.want)
				}
			}
			if runs.Load() != c.runs {
				t.Errorf("handler ran %d times, want %d", runs.Load(), c.runs)
			}
		})
	}
}

func TestFingerprintFieldsConfig(t *testing.T) {
	t.Parallel()
	store, _ := memstore.New(nil)
	for _, cfg := range []idem.Config{
		{FingerprintExclude: []string{"nope"}},
		{FingerprintInclude: []string{"/a~"}},
		{FingerprintExclude: []string{""}},
		{FingerprintExclude: []string{"/a"}, FingerprintInclude: []string{"/b"}},
	} {
		if _, err := idem.NewMiddleware(store, &cfg); err == nil {
			t.Errorf("NewMiddleware accepted %+v", cfg)
		}
	}
}

func TestProblemTypeAndLink(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		base, want string
	}{
		{"", idem.DefaultProblemBaseURL + idem.CodeKeyMissing},
		{"https://docs.example.com/idempotency#", "https://docs.example.com/idempotency#" + idem.CodeKeyMissing},
	} {
		url, _ := fieldServer(t, &idem.Config{ProblemBaseURL: c.base})
		resp := postJSON(t, url, "", `{}`)
		if resp.StatusCode != 400 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if got := resp.Header.Get("Link"); got != "<"+c.want+`>; rel="describedby"` {
			t.Errorf("Link = %q, want the type %s", got, c.want)
		}
	}
	// 422 and 409 too, with the type in the body.
	url, _ := fieldServer(t, nil)
	postJSON(t, url, "k", `{"a":1}`)
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"a":2}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := idem.DefaultProblemBaseURL + idem.CodeKeyReused
	if resp.StatusCode != 422 || resp.Header.Get("Link") != "<"+want+`>; rel="describedby"` || !strings.Contains(string(body), `"type":"`+want+`"`) {
		t.Errorf("422: %v %s", resp.Header, body)
	}
}
