package metrics

import (
	"sync"
	"time"
)

// The rate history kept for the operator console: one bucket per
// RateBucket over the last RateWindow.
const (
	RateBucket = 10 * time.Second
	RateWindow = 15 * time.Minute
	rateSlots  = int(RateWindow / RateBucket)
)

// RateKind is a series of the rate history.
type RateKind int

// The series, in the order RateSample.Counts holds them.
const (
	RateExecutions  RateKind = iota // operations executed and stored
	RateReplays                     // stored responses replayed
	RateConflicts                   // 409: a duplicate while in flight
	RateMismatches                  // 422: a key reused with another payload
	RateStoreErrors                 // the store failed (503)
	rateKinds
)

// RateNames names the series for the console's legend.
var RateNames = [rateKinds]string{"executions", "replays", "409 in flight", "422 key reused", "store errors"}

// RateSample is the count of each series in one bucket.
type RateSample struct {
	// Start is the bucket's start.
	Start  time.Time
	Counts [rateKinds]int64
}

// rates is a ring of buckets, updated by every outcome the Observer sees
// (one mutex, no goroutine: a bucket that no outcome touched is zeroed
// when the ring moves past it).
type rates struct {
	mu    sync.Mutex
	slots [rateSlots]RateSample
	// last is the index (Unix time / RateBucket) of the newest bucket
	// written.
	last int64
}

func (r *rates) add(k RateKind, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.advance(now)
	r.slots[r.last%int64(rateSlots)].Counts[k]++
}

// advance moves the ring to now's bucket, zeroing the buckets it skips.
func (r *rates) advance(now time.Time) {
	idx := now.UnixNano() / int64(RateBucket)
	if idx <= r.last {
		return
	}
	from := max(r.last+1, idx-int64(rateSlots)+1)
	for i := from; i <= idx; i++ {
		r.slots[i%int64(rateSlots)] = RateSample{Start: time.Unix(0, i*int64(RateBucket))}
	}
	r.last = idx
}

// Rates returns the history up to now, oldest bucket first: RateWindow
// divided by RateBucket samples, the last one the bucket now is in (still
// filling).
func (m *Metrics) Rates(now time.Time) []RateSample {
	r := &m.rates
	r.mu.Lock()
	defer r.mu.Unlock()
	r.advance(now)
	out := make([]RateSample, rateSlots)
	for i := range rateSlots {
		idx := r.last - int64(rateSlots) + 1 + int64(i)
		s := r.slots[((idx%int64(rateSlots))+int64(rateSlots))%int64(rateSlots)]
		if s.Start.UnixNano()/int64(RateBucket) != idx {
			s = RateSample{Start: time.Unix(0, idx*int64(RateBucket))}
		}
		out[i] = s
	}
	return out
}
