// Package dupscore tells a store whether its recent claims were mostly of
// new keys or mostly duplicates (replays above all), so that it can start a
// claim with the statement that is cheaper for what it is likely to meet.
// Every statement a store picks between must answer every claim correctly;
// only the cost differs, so a wrong guess costs a round trip, never an
// answer.
//
// It is internal to idem's modules: the SQL stores (pgstore, mysqlstore,
// sqlitestore) share it.
package dupscore

import "sync/atomic"

// Max bounds a Tracker's score: after a run of duplicates, Max/2+1 new
// keys make it say "mostly new" again.
const Max = 64

// A Tracker's score moves one step towards Max for each duplicate and
// towards 0 for each new key. Updates from concurrent claims may race,
// which only blurs the estimate. The zero Tracker says "mostly new".
type Tracker struct {
	score atomic.Int32
	pin   atomic.Int32 // 0 follows the score, 1 pins "new", 2 pins "duplicates"
}

// Record counts one claim: dup is whether it met an existing record.
func (t *Tracker) Record(dup bool) {
	v := t.score.Load()
	switch {
	case dup && v < Max:
		t.score.Add(1)
	case !dup && v > 0:
		t.score.Add(-1)
	}
}

// MostlyNew reports whether most recent claims were of new keys.
func (t *Tracker) MostlyNew() bool {
	switch t.pin.Load() {
	case 1:
		return true
	case 2:
		return false
	}
	return t.score.Load() < Max/2
}

// Pin fixes MostlyNew's answer, for tests that must run a store's every
// path whatever the traffic: "new", "dups", or "" to follow the score
// again.
func (t *Tracker) Pin(mode string) {
	switch mode {
	case "new":
		t.pin.Store(1)
	case "dups":
		t.pin.Store(2)
	default:
		t.pin.Store(0)
	}
}
