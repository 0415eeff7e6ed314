package idem

import (
	"encoding/json"
	"testing"

	"github.com/idemhq/idem/canonjson"
)

// FuzzFingerprintFields selects fields of arbitrary JSON with arbitrary
// pointers: it must never panic, and must give valid JSON for a valid body.
func FuzzFingerprintFields(f *testing.F) {
	f.Add(`{"a":{"b":[1,{"c":2}]},"d":9007199254740993}`, "/a/b/1/c", true)
	f.Add(`[1,2,3]`, "/1", false)
	f.Add(`{"":{"":1}}`, "/", true)
	f.Add(`{"a~b":1,"a/b":2}`, "/a~0b", false)
	f.Fuzz(func(t *testing.T, body, pointer string, exclude bool) {
		var include, excl []string
		if exclude {
			excl = []string{pointer, "/a"}
		} else {
			include = []string{pointer, "/a"}
		}
		fs, err := newFieldSelection(include, excl)
		if err != nil {
			return
		}
		if _, err := canonjson.Append(nil, []byte(body)); err != nil {
			return // the middleware refuses such bodies before selecting
		}
		out, err := fs.apply([]byte(body))
		if err != nil {
			t.Fatalf("apply(%q, %q): %v", body, pointer, err)
		}
		if !json.Valid(out) {
			t.Fatalf("apply(%q, %q) = %q: not JSON", body, pointer, out)
		}
	})
}
