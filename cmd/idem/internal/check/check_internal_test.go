package check

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

func TestObjectMembers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want []string // name=value pairs
	}{
		{`{}`, []string{}},
		{` {"b":1, "a":{"x":[1,2]}} `, []string{`b=1`, `a={"x":[1,2]}`}},
		{`{"n":9007199254740993}`, []string{`n=9007199254740993`}},
		{`{"a":1}{"b":2}`, nil},
		{`[1]`, nil},
		{`{"a":}`, nil},
		{``, nil},
		{`"s"`, nil},
	} {
		ms, ok := objectMembers([]byte(tc.in))
		if ok != (tc.want != nil) {
			t.Errorf("%q: ok %v", tc.in, ok)
			continue
		}
		got := []string{}
		for _, m := range ms {
			got = append(got, m.name+"="+string(m.value))
		}
		if ok && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %q, want %q", tc.in, got, tc.want)
		}
	}
}

// The reordered body is the same JSON value in other bytes.
func TestReorderJSON(t *testing.T) {
	t.Parallel()
	in := `{"amount":2599,"currency":"USD","meta":{"a":1,"b":[true,null]},"big":9007199254740993}`
	out, ok := reorderJSON([]byte(in))
	if !ok {
		t.Fatal("not an object")
	}
	if string(out) == in || !strings.HasPrefix(string(out), "{\n  \"big\" : 9007199254740993,") {
		t.Errorf("not reordered:\n%s", out)
	}
	var a, b any
	if err := json.Unmarshal([]byte(in), &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out, &b); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if !reflect.DeepEqual(a, b) {
		t.Errorf("the value changed:\n%s", out)
	}
}

func TestDeriveVariant(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`{"currency":"USD","amount":2599}`, `{"currency":"USD","amount":2600}`},
		{`{"amount":1.5,"ok":true}`, `{"amount":1.5,"ok":false}`},
		{`{"x":null,"name":"a\"b"}`, `{"x":null,"name":"a\"b-variant"}`},
		{`{"x":[1]}`, `{"x":[1],"idem_check_variant":true}`},
		{`{}`, `{"idem_check_variant":true}`},
	} {
		got, how, ok := deriveVariant([]byte(tc.in))
		if !ok || string(got) != tc.want || how == "" {
			t.Errorf("%s: %s (%q), want %s", tc.in, got, how, tc.want)
		}
	}
	if _, _, ok := deriveVariant([]byte(`[1]`)); ok {
		t.Error("derived a variant of a non-object")
	}
}

// Hand-written requests deliver the key values net/http would refuse or
// drop, byte for byte, and read the response.
func TestSendRaw(t *testing.T) {
	t.Parallel()
	type got struct {
		keys   []string
		body   string
		header string
	}
	seen := make(chan got, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, r.ContentLength)
		r.Body.Read(b)
		seen <- got{r.Header.Values("Idempotency-Key"), string(b), r.Header.Get("Authorization")}
		w.Header().Set("X-Answer", "yes")
		w.WriteHeader(http.StatusTeapot)
		w.Write([]byte("short and stout"))
	}))
	t.Cleanup(srv.Close)
	r, err := newRunner(Options{URL: srv.URL + "/p?q=1", Headers: http.Header{"Authorization": {"Bearer a"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	for _, key := range []string{"", "\"caf\u00e9\"", "a b"} {
		status, h, body, err := r.sendRaw(context.Background(), request{keys: []string{key}, body: []byte(`{"a":1}`)})
		if err != nil {
			t.Fatal(err)
		}
		if status != http.StatusTeapot || h.Get("X-Answer") != "yes" || string(body) != "short and stout" {
			t.Errorf("response %d %v %q", status, h, body)
		}
		g := <-seen
		if !reflect.DeepEqual(g.keys, []string{key}) || g.body != `{"a":1}` || g.header != "Bearer a" {
			t.Errorf("server saw %+v, want key %q", g, key)
		}
	}
}
