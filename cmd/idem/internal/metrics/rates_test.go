package metrics

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idemhq/idem"
)

// The history counts each outcome in the bucket of its time, keeps the
// last RateWindow, and zeroes the buckets no outcome touched.
func TestRates(t *testing.T) {
	t.Parallel()
	m := New()
	base := time.Unix(1_800_000_000, 0) // a bucket boundary
	now := base
	m.now = func() time.Time { return now }
	ctx := context.Background()
	m.Observe(ctx, idem.Event{Kind: idem.EventExecuted})
	m.Observe(ctx, idem.Event{Kind: idem.EventExecuted})
	m.Observe(ctx, idem.Event{Kind: idem.EventReplayed})
	now = base.Add(RateBucket + time.Second)
	m.Observe(ctx, idem.Event{Kind: idem.EventInFlight})
	m.Observe(ctx, idem.Event{Kind: idem.EventMismatch})
	m.Observe(ctx, idem.Event{Kind: idem.EventStoreError, Status: http.StatusServiceUnavailable})
	m.Observe(ctx, idem.Event{Kind: idem.EventRenewed}) // not a series

	got := m.Rates(now)
	if len(got) != int(RateWindow/RateBucket) {
		t.Fatalf("%d samples, want %d", len(got), RateWindow/RateBucket)
	}
	last, prev := got[len(got)-1], got[len(got)-2]
	if !prev.Start.Equal(base) || !last.Start.Equal(base.Add(RateBucket)) {
		t.Fatalf("buckets start at %v and %v, want %v and %v", prev.Start, last.Start, base, base.Add(RateBucket))
	}
	if prev.Counts != [rateKinds]int64{2, 1, 0, 0, 0} || last.Counts != [rateKinds]int64{0, 0, 1, 1, 1} {
		t.Fatalf("counts %v then %v", prev.Counts, last.Counts)
	}
	for i, s := range got[:len(got)-2] {
		if s.Counts != ([rateKinds]int64{}) {
			t.Fatalf("sample %d = %v, want zeros", i, s.Counts)
		}
	}

	// Later, the old buckets leave the window and new ones start empty,
	// also where the ring reuses a slot that held counts.
	now = base.Add(RateWindow)
	got = m.Rates(now)
	if got[0].Start != base.Add(RateBucket) || got[0].Counts[RateConflicts] != 1 {
		t.Fatalf("oldest sample one window later = %+v, want the second bucket", got[0])
	}
	if got[len(got)-1].Counts != ([rateKinds]int64{}) {
		t.Fatalf("newest sample = %v, want zeros (its slot held the first bucket)", got[len(got)-1].Counts)
	}
	now = base.Add(10 * RateWindow)
	for i, s := range m.Rates(now) {
		if s.Counts != ([rateKinds]int64{}) {
			t.Fatalf("sample %d ten windows later = %v, want zeros", i, s.Counts)
		}
	}
}
