package idem

import (
	"strconv"
	"testing"
	"unsafe"
)

// TestScopeCacheBounded checks that the scopes of requests without a
// route pattern are shared while few, and that at most maxUnroutedScopes
// of them are cached whatever the number of paths.
func TestScopeCacheBounded(t *testing.T) {
	t.Parallel()
	m := newMemMiddleware(t)
	a, b := m.scope("", "POST /pay", false), m.scope("", "POST /pay", false)
	if a != Scope("", "POST /pay") || unsafe.StringData(a) != unsafe.StringData(b) {
		t.Fatalf("scope = %q, then %q at another address; want %q shared", a, b, Scope("", "POST /pay"))
	}
	for i := range 2 * maxUnroutedScopes {
		op := "POST /orders/" + strconv.Itoa(i)
		if s := m.scope("", op, false); s != Scope("", op) {
			t.Fatalf("scope(%q) = %q", op, s)
		}
	}
	n := 0
	m.scopes.Range(func(any, any) bool { n++; return true })
	if n > maxUnroutedScopes {
		t.Fatalf("%d scopes cached, want at most %d", n, maxUnroutedScopes)
	}
	if s := m.scope("t1", "POST /pay", false); s != Scope("t1", "POST /pay") {
		t.Fatalf("tenant scope = %q", s)
	}
}
