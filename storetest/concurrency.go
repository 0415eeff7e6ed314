package storetest

import (
	"fmt"
	"sync"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// race runs n goroutines that all start f at once (released by one closed
// channel) and returns their outcomes.
func (b *bundle) race(n int, f func(i int) (idemstore.ClaimResult, error)) []idemstore.ClaimResult {
	b.t.Helper()
	results := make([]idemstore.ClaimResult, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = f(i)
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			b.t.Fatalf("goroutine %d: %v", i, err)
		}
	}
	return results
}

func count(rs []idemstore.ClaimResult, o idemstore.ClaimOutcome) int {
	n := 0
	for _, r := range rs {
		if r.Outcome == o {
			n++
		}
	}
	return n
}

func testConcurrency(t *testing.T, h Harness) {
	t.Run("OneOwnerAmong64", func(t *testing.T) {
		b := setup(t, h)
		scope, key := b.names()
		const n = 64
		tokens := make([]string, n)
		for i := range tokens {
			tokens[i] = b.token()
		}
		rs := b.race(n, func(i int) (idemstore.ClaimResult, error) {
			p := b.claimParams(scope, key, fpA)
			p.Token = tokens[i]
			return b.store.Claim(b.ctx, p)
		})
		if a, f := count(rs, idemstore.ClaimAcquired), count(rs, idemstore.ClaimInFlight); a != 1 || f != n-1 {
			t.Fatalf("%d acquired, %d in flight; want 1 and %d", a, f, n-1)
		}
		// Exactly the winner owns the record.
		owners := 0
		for i, r := range rs {
			p := b.claimParams(scope, key, fpA)
			p.Token = tokens[i]
			err := b.renew(p)
			if (err == nil) != (r.Outcome == idemstore.ClaimAcquired) {
				t.Errorf("goroutine %d: outcome %v but Renew says %v", i, r.Outcome, err)
			}
			if err == nil {
				owners++
			}
		}
		if owners != 1 {
			t.Errorf("%d tokens own the record, want 1", owners)
		}
	})

	t.Run("OneTakeOverAmong32", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		b.clock.Advance(b.lease + b.lease/4)
		const n = 32
		rs := b.race(n, func(int) (idemstore.ClaimResult, error) {
			q := b.other(p)
			q.Now = b.clock.Now()
			return b.store.Claim(b.ctx, q)
		})
		if a := count(rs, idemstore.ClaimAcquired); a != 1 {
			t.Fatalf("%d goroutines took over the expired lease, want 1", a)
		}
		if f := count(rs, idemstore.ClaimInFlight); f != n-1 {
			t.Fatalf("%d saw it in flight, want %d", f, n-1)
		}
	})

	t.Run("ManyKeysInParallel", func(t *testing.T) {
		b := setup(t, h)
		const workers, perWorker = 8, 25
		var wg sync.WaitGroup
		errs := make(chan error, workers)
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perWorker {
					p := b.claimParams(idem.Scope(fmt.Sprint("w", w), "POST /x"), fmt.Sprint("k", i), fpA)
					r, err := b.store.Claim(b.ctx, p)
					if err != nil || r.Outcome != idemstore.ClaimAcquired {
						errs <- fmt.Errorf("worker %d key %d: %v %v", w, i, r.Outcome, err)
						return
					}
					resp := sampleResponse()
					resp.Body = fmt.Appendf(nil, "w%d-k%d", w, i)
					if err := b.complete(p, resp); err != nil {
						errs <- fmt.Errorf("worker %d key %d: complete: %w", w, i, err)
						return
					}
					r, err = b.store.Claim(b.ctx, b.other(p))
					r = b.open(p, r)
					if err != nil || r.Outcome != idemstore.ClaimCompleted || string(r.Record.Response.Body) != string(resp.Body) {
						errs <- fmt.Errorf("worker %d key %d: replay %v %v", w, i, r.Outcome, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
}
