package idemclient_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemhq/idem/idemclient"
)

// BenchmarkRoundTrip measures what the Transport adds to a POST over
// loopback: a key, a cloned request and, without GetBody, a buffered body.
func BenchmarkRoundTrip(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	const body = `{"amount":2599,"currency":"USD","recipient":"r_123"}`
	newBase := func(b *testing.B) *http.Transport {
		t := http.DefaultTransport.(*http.Transport).Clone()
		b.Cleanup(t.CloseIdleConnections)
		return t
	}
	run := func(b *testing.B, rt http.RoundTripper, getBody bool) {
		c := &http.Client{Transport: rt}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				var r io.Reader = strings.NewReader(body)
				if !getBody {
					r = io.MultiReader(r) // hides the type: no GetBody
				}
				req, _ := http.NewRequest(http.MethodPost, srv.URL, r)
				resp, err := c.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	b.Run("bare", func(b *testing.B) { run(b, newBase(b), true) })
	b.Run("idemclient/GetBody", func(b *testing.B) {
		tr, err := idemclient.New(newBase(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		run(b, tr, true)
	})
	b.Run("idemclient/buffered", func(b *testing.B) {
		tr, err := idemclient.New(newBase(b), nil)
		if err != nil {
			b.Fatal(err)
		}
		run(b, tr, false)
	})
}
