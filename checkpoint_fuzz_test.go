package idem_test

import (
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// FuzzParseCheckpoint: a stored checkpoint of any content is parsed or
// refused, never a panic, and what parses has named steps only as stored.
func FuzzParseCheckpoint(f *testing.F) {
	f.Add([]byte(`{"v":1,"steps":[{"name":"payment","done":true,"data":"cGF5XzE="},{"name":"charge","unknown":true}]}`))
	f.Add([]byte(`{"v":2,"steps":[]}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, b []byte) {
		steps, err := idem.ParseCheckpoint(b)
		if err != nil && steps != nil {
			t.Errorf("error %v with steps %v", err, steps)
		}
		if len(b) > idemstore.MaxCheckpoint && err == nil {
			t.Errorf("a %d-byte checkpoint parsed", len(b))
		}
	})
}
