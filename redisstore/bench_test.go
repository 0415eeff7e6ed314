package redisstore_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// The benchmarks compare the store with a raw go-redis loop sending the same
// EVALSHA calls (same scripts, same keys and arguments, prepared in
// advance), at 1, 8 and 32 concurrent workers, in the same run and
// interleaved (see runPaired). The difference is what the store adds:
// hashing the scope and key into the key name, encoding and decoding the
// response, checking and converting replies.
//
//	go test -run '^$' -bench . -benchtime 20000x -count 5

var benchWorkers = []int{1, 8, 32}

func benchResponse() *idem.Response {
	return &idem.Response{
		StatusCode: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/payments/pay_0123456789"},
		},
		Body: []byte(`{"id":"pay_0123456789","amount":1999,"currency":"EUR","status":"succeeded","created":"2026-11-30T06:00:00Z"}`),
	}
}

// benchClient is a client with enough connections for the most workers, so
// that the pool is not what is measured.
func benchClient(b *testing.B) *redis.Client {
	b.Helper()
	c := newClient(b)
	opts := c.Options()
	opts.PoolSize = 64
	big := redis.NewClient(opts)
	b.Cleanup(func() { _ = big.Close() })
	// Both sides then run on EVALSHA from the first operation.
	for _, s := range []*redis.Script{redisstore.ClaimScript, redisstore.CompleteScript} {
		if err := s.Load(b.Context(), big).Err(); err != nil {
			b.Fatal(err)
		}
	}
	return big
}

// BenchmarkClaimComplete: claim a new key and complete it, the work of
// every first request.
func BenchmarkClaimComplete(b *testing.B) {
	c := benchClient(b)
	resp := benchResponse()
	enc, err := resp.MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	const scope = "7:tenant1|POST /payments"
	lease, ttl := (30 * time.Second).Milliseconds(), time.Minute.Milliseconds()
	for _, workers := range benchWorkers {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			s := newStore(b, c, nil)
			store := func(ctx context.Context, i int) error {
				key := "k" + strconv.Itoa(i)
				tok := "t" + strconv.Itoa(i)
				r, err := s.Claim(ctx, idem.ClaimParams{Scope: scope, Key: key, Fingerprint: fpA, Token: tok,
					Lease: 30 * time.Second, TTL: time.Minute})
				if err != nil {
					return err
				}
				if r.Outcome != idem.ClaimAcquired {
					return fmt.Errorf("claim %d: %v", i, r.Outcome)
				}
				return s.Complete(ctx, idem.CompleteParams{Scope: scope, Key: key, Token: tok, Response: resp})
			}
			prefix := newPrefix(b, c)
			keys := make([][]string, b.N)
			toks := make([]string, b.N)
			for i := range keys {
				keys[i] = []string{prefix + "{" + strconv.Itoa(i) + "}"}
				toks[i] = "t" + strconv.Itoa(i)
			}
			raw := func(ctx context.Context, i int) error {
				v, err := redisstore.ClaimScript.EvalSha(ctx, c, keys[i], fpA, toks[i], lease, ttl).Slice()
				if err != nil {
					return err
				}
				if v[0] != int64(1) {
					return fmt.Errorf("claim %d: outcome %v", i, v[0])
				}
				n, err := redisstore.CompleteScript.EvalSha(ctx, c, keys[i], toks[i], enc).Int64()
				if err == nil && n != 1 {
					err = fmt.Errorf("complete %d: %d", i, n)
				}
				return err
			}
			runPaired(b, workers, store, raw)
		})
	}
}

// BenchmarkReplay: claim a completed key and get its response back, the
// work of every retry.
func BenchmarkReplay(b *testing.B) {
	c := benchClient(b)
	resp := benchResponse()
	const scope, key = "7:tenant1|POST /payments", "replayed"
	lease, ttl := (30 * time.Second).Milliseconds(), time.Hour.Milliseconds()
	for _, workers := range benchWorkers {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			s := newStore(b, c, nil)
			ctx := b.Context()
			if _, err := s.Claim(ctx, idem.ClaimParams{Scope: scope, Key: key, Fingerprint: fpA, Token: "owner",
				Lease: 30 * time.Second, TTL: time.Hour}); err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, idem.CompleteParams{Scope: scope, Key: key, Token: "owner", Response: resp}); err != nil {
				b.Fatal(err)
			}
			store := func(ctx context.Context, i int) error {
				r, err := s.Claim(ctx, idem.ClaimParams{Scope: scope, Key: key, Fingerprint: fpA, Token: "retry",
					Lease: 30 * time.Second, TTL: time.Hour})
				if err == nil && (r.Outcome != idem.ClaimCompleted || r.Record.Response.StatusCode != http.StatusCreated) {
					err = fmt.Errorf("replay %d: %v", i, r.Outcome)
				}
				return err
			}
			// The same record, read by the same script without the store.
			keys := []string{s.Key(scope, key)}
			raw := func(ctx context.Context, i int) error {
				v, err := redisstore.ClaimScript.EvalSha(ctx, c, keys, fpA, "retry", lease, ttl).Slice()
				if err == nil && v[0] != int64(2) {
					err = fmt.Errorf("replay %d: outcome %v", i, v[0])
				}
				return err
			}
			runPaired(b, workers, store, raw)
		})
	}
}

// runPaired runs the store's operation and the raw loop's b.N times each,
// over the given number of concurrent workers, in alternating chunks (and
// alternating which goes first), so that load from outside the benchmark
// falls on both alike. It reports each side's ops/s and p50/p99 latency of
// one operation, and the ratio of the store's throughput to the raw
// loop's. ns/op covers both sides.
func runPaired(b *testing.B, workers int, store, raw func(ctx context.Context, i int) error) {
	b.Helper()
	sides := []*side{{name: "store", op: store}, {name: "raw", op: raw}}
	chunk := 50 * workers
	b.ResetTimer()
	for done, round := 0, 0; done < b.N; round++ {
		n := min(chunk, b.N-done)
		for k := range sides {
			sides[(k+round)%2].run(b, workers, done, n)
		}
		done += n
	}
	b.StopTimer()
	for _, sd := range sides {
		sd.report(b)
	}
	b.ReportMetric(sides[0].opsPerSec()/sides[1].opsPerSec(), "store/raw")
}

// side is one of the two loops runPaired compares.
type side struct {
	name    string
	op      func(ctx context.Context, i int) error
	elapsed time.Duration
	lat     []time.Duration
}

// run runs op for indices [from, from+n) over the workers.
func (sd *side) run(b *testing.B, workers, from, n int) {
	var next atomic.Int64
	next.Store(int64(from))
	lat := make([][]time.Duration, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= from+n {
					return
				}
				t0 := time.Now()
				if err := sd.op(b.Context(), i); err != nil {
					errs[w] = err
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	sd.elapsed += time.Since(start)
	for _, err := range errs {
		if err != nil {
			b.Fatalf("%s: %v", sd.name, err)
		}
	}
	for _, l := range lat {
		sd.lat = append(sd.lat, l...)
	}
}

func (sd *side) opsPerSec() float64 { return float64(len(sd.lat)) / sd.elapsed.Seconds() }

func (sd *side) report(b *testing.B) {
	slices.Sort(sd.lat)
	b.ReportMetric(sd.opsPerSec(), sd.name+"-ops/s")
	b.ReportMetric(float64(sd.lat[len(sd.lat)/2])/1e3, sd.name+"-p50-µs")
	b.ReportMetric(float64(sd.lat[len(sd.lat)*99/100])/1e3, sd.name+"-p99-µs")
}
