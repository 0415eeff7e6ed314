package console

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemhq/idem/cmd/idem/internal/backend"
)

// FuzzRecordsQuery: any query of the Records page parses to a bounded
// Query or to an error (a 400), never a panic; a cursor either names a
// record the console listed or is refused.
func FuzzRecordsQuery(f *testing.F) {
	for _, q := range []string{"", "state=in-flight", "limit=500&older=10m", "after=12." + "ab", "after=o5", "after=t0123456789abcdef0123456789abcdef", "scope=%ff", "older=1e9h",
		"after=-1.0000000000000000000000000000000000000000000000000000000000000000", "state=completed&state=x"} {
		f.Add(q)
	}
	s, err := backend.Open(context.Background(), filepath.Join(f.TempDir(), "r.db"))
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	c, err := New(context.Background(), Config{Store: s})
	if err != nil {
		f.Fatal(err)
	}
	defer c.Close()
	f.Fuzz(func(t *testing.T, raw string) {
		r := httptest.NewRequest("GET", "/records", nil)
		r.URL.RawQuery = raw
		q, _, err := c.parseQuery(r, time.Now())
		if err != nil {
			if _, ok := err.(badInput); !ok {
				t.Fatalf("parseQuery(%q) = %v, not a bad input", raw, err)
			}
			return
		}
		if q.Limit < 1 || q.Limit > maxPageSize || len(q.Scope) > maxScopeLen {
			t.Fatalf("parseQuery(%q) = %+v: out of bounds", raw, q)
		}
		if q.After != nil && q.After.Token == "" && q.After.Scope == "" && q.After.Key == "" {
			t.Fatalf("parseQuery(%q) = a cursor naming no record and no store cursor", raw)
		}
	})
}
