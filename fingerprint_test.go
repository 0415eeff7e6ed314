package idem

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"
)

func fp(t *testing.T, in FingerprintInput) string {
	t.Helper()
	s, err := Fingerprint(in)
	if err != nil {
		t.Fatalf("Fingerprint(%+v): %v", in, err)
	}
	return s
}

func TestFingerprintFormat(t *testing.T) {
	s := fp(t, FingerprintInput{Method: "POST", Operation: "POST /x", ContentType: "application/json", Body: []byte(`{}`)})
	if !strings.HasPrefix(s, FingerprintVersion+":") || len(s) != len(FingerprintVersion)+1+64 {
		t.Fatalf("fingerprint %q is not %s: followed by 64 hex digits", s, FingerprintVersion)
	}
	if fingerprintVersionOf(s) != FingerprintVersion {
		t.Fatalf("version of %q = %q", s, fingerprintVersionOf(s))
	}
}

func TestFingerprintSameRequest(t *testing.T) {
	base := FingerprintInput{Method: "POST", Operation: "POST /payments", ContentType: "application/json",
		Body: []byte(`{"amountCents":2599,"currency":"USD","meta":{"a":1,"b":[1,2]}}`)}
	want := fp(t, base)
	for _, v := range []FingerprintInput{
		{Body: []byte(`{"meta":{"b":[1,2],"a":1},"currency":"USD","amountCents":2599}`)},
		{Body: []byte(" {\n  \"amountCents\" : 2599.0 ,\"currency\":\"\\u0055SD\", \"meta\":{\"a\":1e0,\"b\":[1,2]}}\n")},
		{ContentType: "application/json; charset=utf-8"},
		{ContentType: "Application/JSON; Charset=UTF-8"},
		{ContentType: "application/json;charset=\"utf-8\""},
	} {
		in := base
		if v.Body != nil {
			in.Body = v.Body
		}
		if v.ContentType != "" {
			in.ContentType = v.ContentType
		}
		if got := fp(t, in); got != want {
			t.Errorf("%+v: fingerprint differs from the same request", v)
		}
	}
}

func TestFingerprintDifferentRequest(t *testing.T) {
	base := FingerprintInput{Method: "POST", Operation: "POST /payments", ContentType: "application/json", Body: []byte(`{"n":9007199254740993}`)}
	seen := map[string]string{fp(t, base): "base"}
	variants := map[string]FingerprintInput{
		"number beyond 2^53":   {Body: []byte(`{"n":9007199254740992}`)},
		"17th digit":           {Body: []byte(`{"n":0.12345678901234567}`)},
		"17th digit other":     {Body: []byte(`{"n":0.12345678901234568}`)},
		"string not number":    {Body: []byte(`{"n":"9007199254740993"}`)},
		"method":               {Method: "PATCH"},
		"operation":            {Operation: "POST /refunds"},
		"content type":         {ContentType: "application/merge-patch+json"},
		"text":                 {ContentType: "text/plain"},
		"extra member":         {Body: []byte(`{"n":9007199254740993,"x":null}`)},
		"array order":          {Body: []byte(`{"n":[1,2]}`)},
		"array order reversed": {Body: []byte(`{"n":[2,1]}`)},
		"case":                 {Body: []byte(`{"N":9007199254740993}`)},
	}
	for name, v := range variants {
		in := base
		if v.Body != nil {
			in.Body = v.Body
		}
		if v.Method != "" {
			in.Method = v.Method
		}
		if v.Operation != "" {
			in.Operation = v.Operation
		}
		if v.ContentType != "" {
			in.ContentType = v.ContentType
		}
		got := fp(t, in)
		if prev, dup := seen[got]; dup {
			t.Errorf("%s shares a fingerprint with %s", name, prev)
		}
		seen[got] = name
	}
}

func TestFingerprintFieldsAreSeparated(t *testing.T) {
	// Length prefixes keep field boundaries: moving bytes between fields
	// changes the fingerprint.
	a := fp(t, FingerprintInput{Method: "POST", Operation: "ab", Body: []byte("c")})
	b := fp(t, FingerprintInput{Method: "POST", Operation: "a", Body: []byte("bc")})
	if a == b {
		t.Fatal("field boundary not part of the fingerprint")
	}
}

func TestFingerprintNonJSONIsBytes(t *testing.T) {
	in := FingerprintInput{Method: "POST", Operation: "POST /upload", ContentType: "text/plain", Body: []byte(`{"b":1,"a":2}`)}
	re := in
	re.Body = []byte(`{"a":2,"b":1}`)
	if fp(t, in) == fp(t, re) {
		t.Fatal("a text/plain body was canonicalised as JSON")
	}
	// Invalid JSON is fine when the body is not declared JSON.
	fp(t, FingerprintInput{Method: "POST", ContentType: "text/plain", Body: []byte(`{"a":1,"a":2}`)})
}

func TestFingerprintPayload(t *testing.T) {
	in := FingerprintInput{Method: "POST", Operation: "POST /p", ContentType: "application/json", Body: []byte(`not json`), Payload: true}
	if _, err := Fingerprint(in); err != nil {
		t.Fatalf("payload is hashed as given, got %v", err)
	}
	body := FingerprintInput{Method: "POST", Operation: "POST /p", ContentType: "application/json", Body: []byte(`{"a":1}`)}
	payload := body
	payload.Payload = true
	if fp(t, body) == fp(t, payload) {
		t.Fatal("a payload and a body with the same bytes share a fingerprint")
	}
}

func TestFingerprintRejectsBadJSON(t *testing.T) {
	for _, body := range []string{`{"a":1,"a":2}`, "{\"a\":\"\xff\"}", `{"a":`} {
		_, err := Fingerprint(FingerprintInput{Method: "POST", ContentType: "application/json", Body: []byte(body)})
		if !errors.Is(err, ErrInvalidJSON) {
			t.Errorf("Fingerprint(%q) = %v, want ErrInvalidJSON", body, err)
		}
	}
	// An empty JSON body is not an error: it is hashed as no body.
	fp(t, FingerprintInput{Method: "POST", ContentType: "application/json"})
}

// TestHexPairs checks the digest's hex table against encoding/hex for
// every byte value.
func TestHexPairs(t *testing.T) {
	for c := range 256 {
		if got, want := hexPairs[2*c:2*c+2], hex.EncodeToString([]byte{byte(c)}); got != want {
			t.Fatalf("hexPairs[%#x] = %q, want %q", c, got, want)
		}
	}
}
