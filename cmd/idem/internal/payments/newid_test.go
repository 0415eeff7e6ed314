package payments

import (
	"strings"
	"testing"
	"time"
)

// Payment ids have the API's form, differ, and sort by creation time
// (newID).
func TestNewIDOrder(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	prev := newID()
	for range 1000 {
		id := newID()
		if !ValidPaymentID(id) {
			t.Fatalf("newID() = %q, not a payment id", id)
		}
		if seen[id] {
			t.Fatalf("newID() returned %q twice", id)
		}
		seen[id] = true
		// Ids of the same millisecond share the time digits and are in
		// random order; across milliseconds they sort.
		if id[:14] < prev[:14] {
			t.Fatalf("%q sorts before the earlier %q", id, prev)
		}
		prev = id
	}
	for _, at := range []time.Time{time.Unix(0, 0), time.Date(2026, 12, 2, 15, 0, 0, 0, time.UTC), time.Date(2999, 1, 1, 0, 0, 0, 0, time.UTC)} {
		for _, later := range []time.Duration{time.Millisecond, 31 * time.Millisecond, 32 * time.Millisecond, time.Hour} {
			before, after := newIDAt(at), newIDAt(at.Add(later))
			if !ValidPaymentID(before) || !ValidPaymentID(after) {
				t.Fatalf("%q, %q: not payment ids", before, after)
			}
			if strings.Compare(after, before) <= 0 {
				t.Errorf("%q, made %v after %q, does not sort after it", after, later, before)
			}
		}
	}
}
