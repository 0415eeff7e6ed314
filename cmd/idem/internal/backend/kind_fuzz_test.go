package backend

import (
	"strings"
	"testing"
)

// FuzzKindOf feeds arbitrary --store values to the parser: it never
// panics; a value is either an error or one kind; a URL kind's scheme is
// one of the supported ones in any case, and normalise makes it lower case
// without touching the rest.
func FuzzKindOf(f *testing.F) {
	for _, s := range []string{"idem.db", "memory", "MEMORY", "postgres://u@h/db", "REDIS://h:6379/0",
		"rediss://h", "localhost:6379", "[::1]:5432", "mysql://x", `C:\x.db`, "./a:b", "", ":", "a:", "ab:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		k, err := KindOf(spec)
		if err != nil {
			if k != "" {
				t.Fatalf("KindOf(%q) = %q with error %v", spec, k, err)
			}
			return
		}
		n := normalise(spec)
		if len(n) != len(spec) || !strings.EqualFold(n, spec) {
			t.Fatalf("normalise(%q) = %q", spec, n)
		}
		switch k {
		case Postgres:
			if !strings.HasPrefix(n, "postgres:") && !strings.HasPrefix(n, "postgresql:") {
				t.Fatalf("KindOf(%q) = postgres", spec)
			}
		case Redis:
			if !strings.HasPrefix(n, "redis:") && !strings.HasPrefix(n, "rediss:") {
				t.Fatalf("KindOf(%q) = redis", spec)
			}
		case SQLite:
			if _, ok := schemeOf(spec); ok || hostPort.MatchString(spec) || spec == "" {
				t.Fatalf("KindOf(%q) = sqlite for a URL or an address", spec)
			}
		case Memory:
			if !strings.EqualFold(spec, "memory") {
				t.Fatalf("KindOf(%q) = memory", spec)
			}
		default:
			t.Fatalf("KindOf(%q) = %q", spec, k)
		}
	})
}
