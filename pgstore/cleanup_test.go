package pgstore_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/pgstore"
)

// TestCleanupImpact measures what batched DeleteExpired does to live
// traffic: a table holds 1,000,000 expired records; claim+complete traffic
// runs alone, then while DeleteExpired removes them in batches, then alone
// again; it reports the traffic's throughput and latency percentiles in
// each phase and the deletion rate. It takes a few minutes and runs only
// with IDEM_PG_CLEANUP_BENCH=1 (IDEM_PG_CLEANUP_ROWS, IDEM_PG_CLEANUP_BATCH
// and IDEM_PG_CLEANUP_WORKERS override 1,000,000, 10,000 and 8).
func TestCleanupImpact(t *testing.T) {
	if os.Getenv("IDEM_PG_CLEANUP_BENCH") != "1" {
		t.Skip("set IDEM_PG_CLEANUP_BENCH=1 to run the cleanup measurement")
	}
	envInt := func(name string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
			return v
		}
		return def
	}
	rows, batch, workers := envInt("IDEM_PG_CLEANUP_ROWS", 1_000_000), envInt("IDEM_PG_CLEANUP_BATCH", 10_000), envInt("IDEM_PG_CLEANUP_WORKERS", 8)
	const phase = 15 * time.Second

	pool := newPool(t, int32(workers+4))
	schema := freshSchema(t, pool)
	store, err := pgstore.New(t.Context(), pool, &pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	table := schema + "." + pgstore.DefaultTable
	resp, err := benchResponse.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	// Expired completed records with a typical response, their expiry
	// spread over the past day, as a day of traffic leaves them.
	if _, err := pool.Exec(t.Context(), `INSERT INTO `+table+` (scope, key, fingerprint, expires_at, response)
		SELECT '5:tenant|POST /payments', 'expired-' || i, 'v1:' || md5(i::text) || md5(i::text),
		       now() - interval '1 second' - (i % 86400) * interval '1 second', $2::bytea
		FROM generate_series(1, $1) AS i`, rows, resp); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), "VACUUM ANALYZE "+table); err != nil {
		t.Fatal(err)
	}
	t.Logf("inserted %d expired records in %v", rows, time.Since(start).Round(time.Millisecond))

	var keySeq atomic.Int64
	traffic := func(stop <-chan struct{}) ([]time.Duration, time.Duration, error) {
		lat := make([][]time.Duration, workers)
		errs := make(chan error, workers)
		var wg sync.WaitGroup
		t0 := time.Now()
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx := context.Background()
				for {
					select {
					case <-stop:
						return
					default:
					}
					k := fmt.Sprint("live-", keySeq.Add(1))
					p := idem.ClaimParams{Scope: "5:tenant|POST /payments", Key: k, Fingerprint: fpA, Token: k,
						Lease: 30 * time.Second, TTL: 24 * time.Hour}
					s := time.Now()
					if _, err := store.Claim(ctx, p); err != nil {
						errs <- err
						return
					}
					if err := store.Complete(ctx, idem.CompleteParams{Scope: p.Scope, Key: k, Token: k, Response: benchResponse}); err != nil {
						errs <- err
						return
					}
					lat[w] = append(lat[w], time.Since(s))
				}
			}()
		}
		wg.Wait()
		elapsed := time.Since(t0)
		close(errs)
		return slices.Concat(lat...), elapsed, <-errs
	}
	report := func(name string, lat []time.Duration, elapsed time.Duration) {
		slices.Sort(lat)
		pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
		t.Logf("%-22s %6d ops in %5.1fs = %6.0f ops/s  p50 %6.2fms  p99 %6.2fms  p99.9 %6.2fms  max %6.2fms",
			name, len(lat), elapsed.Seconds(), float64(len(lat))/elapsed.Seconds(),
			ms(pct(0.5)), ms(pct(0.99)), ms(pct(0.999)), ms(lat[len(lat)-1]))
	}
	timed := func(d time.Duration) ([]time.Duration, time.Duration) {
		stop := make(chan struct{})
		timer := time.AfterFunc(d, func() { close(stop) })
		defer timer.Stop()
		lat, elapsed, err := traffic(stop)
		if err != nil {
			t.Fatal(err)
		}
		return lat, elapsed
	}

	lat, elapsed := timed(phase)
	report("traffic alone (before)", lat, elapsed)

	// Traffic while the deletion runs, until it has deleted everything.
	stop := make(chan struct{})
	type trafficResult struct {
		lat     []time.Duration
		elapsed time.Duration
		err     error
	}
	done := make(chan trafficResult, 1)
	go func() {
		lat, elapsed, err := traffic(stop)
		done <- trafficResult{lat, elapsed, err}
	}()
	delStart := time.Now()
	deleted, calls := 0, 0
	var batchLat []time.Duration
	for {
		s := time.Now()
		n, err := store.DeleteExpired(t.Context(), idem.DeleteExpiredParams{Limit: batch})
		if err != nil {
			close(stop)
			t.Fatal(err)
		}
		batchLat = append(batchLat, time.Since(s))
		deleted += n
		calls++
		if n < batch {
			break
		}
	}
	delElapsed := time.Since(delStart)
	close(stop)
	during := <-done
	if during.err != nil {
		t.Fatal(during.err)
	}
	slices.Sort(batchLat)
	t.Logf("deleted %d records in %d calls of %d in %.1fs = %.0f records/s; per call p50 %.0fms max %.0fms",
		deleted, calls, batch, delElapsed.Seconds(), float64(deleted)/delElapsed.Seconds(),
		ms(batchLat[len(batchLat)/2]), ms(batchLat[len(batchLat)-1]))
	report("traffic with deletion", during.lat, during.elapsed)
	if deleted != rows {
		t.Errorf("deleted %d, want %d", deleted, rows)
	}

	lat, elapsed = timed(phase)
	report("traffic alone (after)", lat, elapsed)

	// How many of Complete's updates stayed on their page (heap-only
	// updates, no index writes). The statistics lag by up to a second.
	var upd, hot int64
	if err := pool.QueryRow(t.Context(), "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2",
		schema, pgstore.DefaultTable).Scan(&upd, &hot); err != nil {
		t.Fatal(err)
	}
	if upd > 0 {
		t.Logf("updates: %d, heap-only: %d (%.0f%%)", upd, hot, 100*float64(hot)/float64(upd))
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
