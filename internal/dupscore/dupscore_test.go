package dupscore

import (
	"sync"
	"testing"
)

func TestTrackerFollowsTraffic(t *testing.T) {
	var tr Tracker
	if !tr.MostlyNew() {
		t.Fatal("a new Tracker says duplicates")
	}
	for range Max / 2 {
		tr.Record(true)
	}
	if tr.MostlyNew() {
		t.Fatalf("after %d duplicates: mostly new", Max/2)
	}
	for range 10 * Max { // saturates at Max
		tr.Record(true)
	}
	for range Max / 2 {
		tr.Record(false)
	}
	if tr.MostlyNew() {
		t.Fatalf("after a run of duplicates and %d new keys: mostly new", Max/2)
	}
	tr.Record(false)
	if !tr.MostlyNew() {
		t.Fatalf("after a run of duplicates and %d new keys: duplicates", Max/2+1)
	}
	for range 10 * Max { // saturates at 0
		tr.Record(false)
	}
	tr.Record(true)
	if !tr.MostlyNew() {
		t.Fatal("one duplicate after a run of new keys: duplicates")
	}
}

func TestTrackerPin(t *testing.T) {
	var tr Tracker
	tr.Pin("dups")
	if tr.MostlyNew() {
		t.Error(`Pin("dups"): mostly new`)
	}
	for range Max {
		tr.Record(true)
	}
	tr.Pin("new")
	if !tr.MostlyNew() {
		t.Error(`Pin("new"): duplicates`)
	}
	tr.Pin("")
	if tr.MostlyNew() {
		t.Error("unpinned after a run of duplicates: mostly new")
	}
}

// TestTrackerStaysInBounds records from many goroutines at once: races
// between the load and the add may overshoot by at most the number of
// racing goroutines, and the score must come back.
func TestTrackerStaysInBounds(t *testing.T) {
	var tr Tracker
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 10000 {
				tr.Record(g%2 == 0)
			}
		})
	}
	wg.Wait()
	if v := tr.score.Load(); v < -8 || v > Max+8 {
		t.Fatalf("score %d after concurrent records, want within [-8, %d]", v, Max+8)
	}
	for range 2 * Max {
		tr.Record(false)
	}
	if !tr.MostlyNew() {
		t.Fatal("after a run of new keys: duplicates")
	}
}
