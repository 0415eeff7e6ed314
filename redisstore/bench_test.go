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
// advance), at 1, 8 and 32 concurrent workers. The difference is what the
// store adds: hashing the scope and key into the key name, encoding and
// decoding the response, checking and converting replies. Each reports
// ops/s and the p50 and p99 latency of one operation.
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
		b.Run(fmt.Sprintf("store/workers=%d", workers), func(b *testing.B) {
			s := newStore(b, c, nil)
			runWorkers(b, workers, func(ctx context.Context, i int) error {
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
			})
		})
		b.Run(fmt.Sprintf("raw/workers=%d", workers), func(b *testing.B) {
			prefix := newPrefix(b, c)
			keys := make([][]string, b.N)
			toks := make([]string, b.N)
			for i := range keys {
				keys[i] = []string{prefix + "{" + strconv.Itoa(i) + "}"}
				toks[i] = "t" + strconv.Itoa(i)
			}
			runWorkers(b, workers, func(ctx context.Context, i int) error {
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
			})
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
		b.Run(fmt.Sprintf("store/workers=%d", workers), func(b *testing.B) {
			s := newStore(b, c, nil)
			ctx := b.Context()
			if _, err := s.Claim(ctx, idem.ClaimParams{Scope: scope, Key: key, Fingerprint: fpA, Token: "owner",
				Lease: 30 * time.Second, TTL: time.Hour}); err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, idem.CompleteParams{Scope: scope, Key: key, Token: "owner", Response: resp}); err != nil {
				b.Fatal(err)
			}
			runWorkers(b, workers, func(ctx context.Context, i int) error {
				r, err := s.Claim(ctx, idem.ClaimParams{Scope: scope, Key: key, Fingerprint: fpA, Token: "retry",
					Lease: 30 * time.Second, TTL: time.Hour})
				if err == nil && (r.Outcome != idem.ClaimCompleted || r.Record.Response.StatusCode != http.StatusCreated) {
					err = fmt.Errorf("replay %d: %v", i, r.Outcome)
				}
				return err
			})
		})
		b.Run(fmt.Sprintf("raw/workers=%d", workers), func(b *testing.B) {
			s := newStore(b, c, nil)
			ctx := b.Context()
			if _, err := s.Claim(ctx, idem.ClaimParams{Scope: scope, Key: key, Fingerprint: fpA, Token: "owner",
				Lease: 30 * time.Second, TTL: time.Hour}); err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(ctx, idem.CompleteParams{Scope: scope, Key: key, Token: "owner", Response: resp}); err != nil {
				b.Fatal(err)
			}
			keys := []string{s.Key(scope, key)}
			runWorkers(b, workers, func(ctx context.Context, i int) error {
				v, err := redisstore.ClaimScript.EvalSha(ctx, c, keys, fpA, "retry", lease, ttl).Slice()
				if err == nil && v[0] != int64(2) {
					err = fmt.Errorf("replay %d: outcome %v", i, v[0])
				}
				return err
			})
		})
	}
}

// runWorkers runs op b.N times in total, spread over the given number of
// goroutines, and reports throughput and per-operation latency.
func runWorkers(b *testing.B, workers int, op func(ctx context.Context, i int) error) {
	b.Helper()
	ctx := b.Context()
	var next atomic.Int64
	lat := make([][]time.Duration, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := range workers {
		lat[w] = make([]time.Duration, 0, b.N/workers+1)
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= b.N {
					return
				}
				t0 := time.Now()
				if err := op(ctx, i); err != nil {
					errs[w] = err
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(float64(all[len(all)/2])/1e3, "p50-µs")
	b.ReportMetric(float64(all[len(all)*99/100])/1e3, "p99-µs")
}
