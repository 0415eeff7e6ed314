package redisstore_test

import (
	"slices"
	"testing"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/redisstore"
)

// SCAN may return a key twice while Redis resizes its table: a page never
// lists a record twice, whether the repeat is in one step or across steps.
func TestDropListedRepeats(t *testing.T) {
	rec := func(id string) idemstore.RecordInfo { return idemstore.RecordInfo{ID: id} }
	ids := func(rs []idemstore.RecordInfo) []string {
		var out []string
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	listed := []idemstore.RecordInfo{rec("a"), rec("b")}
	step := []idemstore.RecordInfo{rec("b"), rec("c"), rec("c"), rec("d"), rec("a")}
	got := ids(redisstore.DropListed(step, listed))
	if want := []string{"c", "d"}; !slices.Equal(got, want) {
		t.Errorf("dropListed = %v, want %v", got, want)
	}
}
