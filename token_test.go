package idem

import (
	"strconv"
	"testing"

	"github.com/idemhq/idem/memstore"
)

// TestNewTokenBatches checks that tokens made in batches are the prefix and
// the counter in base 36, one value after the other across batches.
func TestNewTokenBatches(t *testing.T) {
	store, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := NewExecutor(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i <= 3*tokenBatchSize+5; i++ {
		if got, want := e.newToken(), e.tokenPrefix+strconv.FormatUint(i, 36); got != want {
			t.Fatalf("token %d = %q, want %q", i, got, want)
		}
	}
}
