package storetest

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/idemhq/idem/idemstore"
)

func testResponse(t *testing.T, h Harness) {
	allBytes := make([]byte, 256)
	for i := range allBytes {
		allBytes[i] = byte(i)
	}
	cases := map[string]*idemstore.Response{
		"BinaryBody": {StatusCode: 200, Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: allBytes},
		"EmptyBody":  {StatusCode: 204, Header: http.Header{"X-Empty": {""}}},
		"NoHeaders":  {StatusCode: 202, Body: []byte("accepted")},
		"ManyValues": {StatusCode: 201, Header: http.Header{
			"Link":          {`</a>; rel="next"`, `</b>; rel="prev"`},
			"Cache-Control": {"no-store"},
			"X-Unicode":     {"żółć €"},
		}, Body: []byte(`{"ok":true}`)},
		"ClientError":  {StatusCode: 422, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: []byte(`{"title":"no"}`)},
		"Redirect":     {StatusCode: 303, Header: http.Header{"Location": {"/elsewhere"}}},
		"LargeBody":    {StatusCode: 200, Body: bytes.Repeat([]byte("0123456789abcdef"), 1<<16)},
		"Unreplayable": {StatusCode: 200, Unreplayable: true},
	}
	for name, want := range cases {
		t.Run(name, func(t *testing.T) {
			b := setup(t, h)
			p := b.acquire(fpA)
			if err := b.complete(p, want); err != nil {
				t.Fatalf("Complete: %v", err)
			}
			r := b.mustOutcome(b.other(p), idemstore.ClaimCompleted)
			if d := sameResponse(r.Record.Response, want); d != "" {
				t.Errorf("round trip: %s", d)
			}
		})
	}
}
