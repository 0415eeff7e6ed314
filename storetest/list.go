package storetest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// walk lists every page of p (from p.After) and returns their records. It
// fails the test on an error, a page over the limit, a page with a
// response, and a cursor that repeats (a walk that would never end).
func walk(t *testing.T, b *bundle, in idemstore.Inspector, p idemstore.ListParams) []idemstore.RecordInfo {
	t.Helper()
	var out []idemstore.RecordInfo
	seen := map[string]bool{}
	for {
		page, err := in.List(b.ctx, p)
		if err != nil {
			t.Fatalf("List(%+v): %v", p, err)
		}
		if len(page.Records) > p.Limit {
			t.Fatalf("List(limit %d) returned %d records", p.Limit, len(page.Records))
		}
		for _, r := range page.Records {
			if r.Response != nil {
				t.Fatal("List returned a response")
			}
		}
		out = append(out, page.Records...)
		if page.Next == "" {
			return out
		}
		if seen[page.Next] {
			t.Fatalf("List returned the cursor %q twice: the walk would not end", page.Next)
		}
		seen[page.Next] = true
		p.After = page.Next
	}
}

// seedList creates n records, each with a fingerprint of its own (List
// shows fingerprints on every store, hashed keys or not), every third one
// completed, with a retention that outlasts the test on a server clock.
// It returns the fingerprints in creation order and, for each, whether the
// record is completed.
func seedList(b *bundle, n int) ([]string, map[string]bool) {
	b.t.Helper()
	fps := make([]string, n)
	completed := map[string]bool{}
	for i := range fps {
		p := b.longClaim(listFingerprint(b.seq.Add(1)))
		b.mustOutcome(p, idemstore.ClaimAcquired)
		fps[i] = p.Fingerprint
		completed[p.Fingerprint] = i%3 == 0
		if i%3 == 0 {
			if err := b.complete(p, sampleResponse()); err != nil {
				b.t.Fatalf("Complete: %v", err)
			}
		}
	}
	return fps, completed
}

// longClaim returns the params of a claim of a fresh key whose lease and
// retention last ten minutes, so that records live through a listing on a
// server clock too.
func (b *bundle) longClaim(fp string) idemstore.ClaimParams {
	scope, key := b.names()
	p := b.claimParams(scope, key, fp)
	p.Lease, p.TTL = max(p.Lease, 10*time.Minute), max(p.TTL, 10*time.Minute)
	return p
}

func listFingerprint(n int64) string {
	return fmt.Sprintf("%s:%064x", idem.FingerprintVersion, n)
}

// countOf counts the records of a walk by fingerprint.
func countOf(recs []idemstore.RecordInfo) map[string]int {
	n := map[string]int{}
	for _, r := range recs {
		n[r.Fingerprint]++
	}
	return n
}

// checkCover checks that a walk listed each of want exactly once (at least
// once for a ScanOrder store) and nothing else but the records allowed.
func checkCover(t *testing.T, h Harness, what string, recs []idemstore.RecordInfo, want []string, allowed func(fp string) bool) {
	t.Helper()
	n := countOf(recs)
	for _, fp := range want {
		switch c := n[fp]; {
		case c == 0:
			t.Errorf("%s: the record %s was not listed", what, fp)
		case c > 1 && !h.ScanOrder:
			t.Errorf("%s: the record %s was listed %d times", what, fp, c)
		}
	}
	for fp, c := range n {
		if !slices.Contains(want, fp) && (allowed == nil || !allowed(fp)) {
			t.Errorf("%s: listed a record it should not have (%s, %d times)", what, fp, c)
		}
	}
}

// testListPages checks List's pages on a quiet store: every record once, in
// a stable order, pages within their limit, filters kept across pages.
func testListPages(t *testing.T, h Harness) {
	b := setup(t, h)
	in, ok := b.store.(idemstore.Inspector)
	if !ok {
		t.Skip("the store does not implement idemstore.Inspector")
	}
	const n = 240
	fps, completed := seedList(b, n)
	now := b.clock.Now()

	var first []idemstore.RecordInfo
	for _, limit := range []int{7, 1, 64, n - 1, n, 1000} {
		recs := walk(t, b, in, idemstore.ListParams{Limit: limit, Now: now})
		checkCover(t, h, fmt.Sprintf("walk with limit %d", limit), recs, fps, nil)
		if h.ScanOrder {
			continue
		}
		// The order is the store's and stays the same from walk to walk.
		if first == nil {
			first = recs
		} else if !slices.EqualFunc(recs, first, func(a, b idemstore.RecordInfo) bool { return a.Fingerprint == b.Fingerprint }) {
			t.Errorf("the walk with limit %d listed the records in another order than the first walk", limit)
		}
	}

	if !h.ScanOrder {
		// An ordered store knows where its records end: a page that takes
		// the last record says so.
		page, err := in.List(b.ctx, idemstore.ListParams{Limit: n, Now: now})
		if err != nil || len(page.Records) != n || page.Next != "" {
			t.Errorf("List(limit %d) of %d records = %d records, next %q, %v; want all and no next", n, n, len(page.Records), page.Next, err)
		}
		page, err = in.List(b.ctx, idemstore.ListParams{Limit: n - 1, Now: now})
		if err != nil || len(page.Records) != n-1 || page.Next == "" {
			t.Fatalf("List(limit %d) of %d records = %d records, next %q, %v", n-1, n, len(page.Records), page.Next, err)
		}
		page, err = in.List(b.ctx, idemstore.ListParams{Limit: n, After: page.Next, Now: now})
		if err != nil || len(page.Records) != 1 || page.Next != "" {
			t.Errorf("the page after %d of %d records = %d records, next %q, %v; want 1 and no next", n-1, n, len(page.Records), page.Next, err)
		}
	}

	// A State filter holds on every page.
	var done, running []string
	for _, fp := range fps {
		if completed[fp] {
			done = append(done, fp)
		} else {
			running = append(running, fp)
		}
	}
	for _, c := range []struct {
		state idemstore.RecordState
		want  []string
	}{{idemstore.StateCompleted, done}, {idemstore.StateInFlight, running}} {
		recs := walk(t, b, in, idemstore.ListParams{State: c.state, Limit: 9, Now: now})
		checkCover(t, h, fmt.Sprintf("walk of %v records", c.state), recs, c.want, nil)
		for _, r := range recs {
			if r.State != c.state {
				t.Errorf("walk of %v records listed one %v", c.state, r.State)
			}
		}
	}
}

// testListChurn walks the records while another goroutine creates and
// deletes records between (and during) the pages: every record that lives
// through the walk is listed exactly once (at least once for a ScanOrder
// store), one created or deleted during it at most once.
func testListChurn(t *testing.T, h Harness) {
	b := setup(t, h)
	in, ok := b.store.(idemstore.Inspector)
	if !ok {
		t.Skip("the store does not implement idemstore.Inspector")
	}
	stable, _ := seedList(b, 150)

	// The churn goroutine alternates: claim a new record, force-delete the
	// oldest of its own. After each step it reports on ops, which the
	// walker waits for between pages, so that every page boundary sees
	// changes, while the next step runs during the walker's next List.
	type churnRecord struct{ scope, key, fp string }
	var (
		ops     = make(chan error)
		stop    = make(chan struct{})
		stopped = make(chan []string, 1)
	)
	go func() {
		var live []churnRecord
		var all []string
		defer func() { stopped <- all }()
		for i := 0; ; i++ {
			var err error
			if i%2 == 0 || len(live) == 0 {
				p := b.longClaim(listFingerprint(b.seq.Add(1)))
				p.Now = b.clock.Now()
				var r idemstore.ClaimResult
				if r, err = b.store.Claim(b.ctx, p); err == nil && r.Outcome != idemstore.ClaimAcquired {
					err = fmt.Errorf("claim of a new key: outcome %v", r.Outcome)
				}
				live = append(live, churnRecord{p.Scope, p.Key, p.Fingerprint})
				all = append(all, p.Fingerprint)
			} else {
				c := live[0]
				live = live[1:]
				err = in.Delete(b.ctx, idemstore.DeleteParams{Scope: c.scope, Key: c.key, Force: true, Now: b.clock.Now()})
			}
			select {
			case ops <- err:
			case <-stop:
				return
			}
		}
	}()

	p := idemstore.ListParams{Limit: 5, Now: b.clock.Now()}
	var recs []idemstore.RecordInfo
	for pages := 0; ; pages++ {
		page, err := in.List(b.ctx, p)
		if err != nil {
			close(stop)
			<-stopped
			t.Fatalf("List during churn: %v", err)
		}
		recs = append(recs, page.Records...)
		if page.Next == "" || pages > 10000 {
			break
		}
		p.After = page.Next
		if err := <-ops; err != nil {
			close(stop)
			<-stopped
			t.Fatalf("churn: %v", err)
		}
	}
	close(stop)
	churned := <-stopped
	if len(churned) < 2 {
		t.Fatalf("only %d records churned during the walk", len(churned))
	}
	checkCover(t, h, "walk during churn", recs, stable, func(fp string) bool { return slices.Contains(churned, fp) })
	if !h.ScanOrder {
		for fp, c := range countOf(recs) {
			if c > 1 {
				t.Errorf("walk during churn listed %s %d times", fp, c)
			}
		}
	}
}
