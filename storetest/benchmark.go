package storetest

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// BenchHarness tells Benchmark how to get a store.
type BenchHarness struct {
	// NewStore returns a fresh, empty store, isolated from every other
	// (as Harness.NewStore), and registers its cleanup with b. Benchmark
	// calls it once per path.
	NewStore func(b *testing.B) idemstore.Store
}

// Benchmark measures the store operations of idem's request paths, the same
// way for every store, so that their numbers compare. A store's benchmarks
// call it once:
//
//	func BenchmarkStore(b *testing.B) {
//		storetest.Benchmark(b, storetest.BenchHarness{
//			NewStore: func(b *testing.B) idemstore.Store { return newIsolatedStore(b) },
//		})
//	}
//
// The paths, each a sub-benchmark on a fresh store:
//
//   - ClaimComplete: a first execution (Claim of a new key, then Complete
//     with a small JSON response);
//   - Replay: a retry (Claim of a completed key, which returns the stored
//     response);
//   - InFlight: a duplicate while the first attempt runs (Claim of a key
//     whose lease is held).
//
// Each runs with one goroutine (workers=1), then with 8 per GOMAXPROCS
// (b.RunParallel), as concurrent requests of one process do; ns/op is the
// wall time per operation, so the parallel figure is the inverse of the
// throughput. Time and leases are long enough that nothing expires during
// a run.
func Benchmark(b *testing.B, h BenchHarness) {
	if h.NewStore == nil {
		b.Fatal("storetest: BenchHarness.NewStore is nil")
	}
	var seq atomic.Int64 // keys and tokens: unique across every run
	next := func(prefix string) string { return prefix + strconv.FormatInt(seq.Add(1), 36) }
	params := func(key, token string) idemstore.ClaimParams {
		return idemstore.ClaimParams{Scope: benchScope, Key: key, Fingerprint: benchFingerprint, Token: token,
			Lease: time.Minute, TTL: time.Hour, Now: time.Now()}
	}
	paths := []struct {
		name string
		// setup prepares the store and returns the operation to measure.
		setup func(b *testing.B, s idemstore.Store) func(ctx context.Context) error
	}{
		{"ClaimComplete", func(b *testing.B, s idemstore.Store) func(ctx context.Context) error {
			return func(ctx context.Context) error {
				key := next("first-")
				p := params(key, key)
				if err := claimAs(ctx, s, p, idemstore.ClaimAcquired); err != nil {
					return err
				}
				return s.Complete(ctx, idemstore.CompleteParams{Scope: p.Scope, Key: key, Token: key, Response: benchResponse, Now: p.Now})
			}
		}},
		{"Replay", func(b *testing.B, s idemstore.Store) func(ctx context.Context) error {
			p := params("replayed", "owner")
			if err := claimAs(b.Context(), s, p, idemstore.ClaimAcquired); err != nil {
				b.Fatal(err)
			}
			if err := s.Complete(b.Context(), idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: benchResponse, Now: p.Now}); err != nil {
				b.Fatal(err)
			}
			return func(ctx context.Context) error {
				return claimAs(ctx, s, params("replayed", next("retry-")), idemstore.ClaimCompleted)
			}
		}},
		{"InFlight", func(b *testing.B, s idemstore.Store) func(ctx context.Context) error {
			p := params("running", "owner")
			p.Lease = time.Hour
			if err := claimAs(b.Context(), s, p, idemstore.ClaimAcquired); err != nil {
				b.Fatal(err)
			}
			return func(ctx context.Context) error {
				return claimAs(ctx, s, params("running", next("dup-")), idemstore.ClaimInFlight)
			}
		}},
	}
	for _, path := range paths {
		b.Run(path.name, func(b *testing.B) {
			op := path.setup(b, h.NewStore(b))
			ctx := b.Context()
			// Once untimed, so that statements are prepared and
			// connections open before the first measurement.
			if err := op(ctx); err != nil {
				b.Fatal(err)
			}
			b.Run("workers=1", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if err := op(ctx); err != nil {
						b.Fatal(err)
					}
				}
			})
			const perProc = 8
			b.Run(fmt.Sprintf("workers=%d", perProc*runtime.GOMAXPROCS(0)), func(b *testing.B) {
				b.ReportAllocs()
				b.SetParallelism(perProc)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := op(ctx); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		})
	}
}

// The record Benchmark's operations write: a scope as the middleware makes
// one, a fingerprint of a real one's length, a typical small JSON answer.
var (
	benchScope       = idem.Scope("tenant-1", "POST /api/payments")
	benchFingerprint = "v1:" + fmt.Sprintf("%064x", 5)
	benchResponse    = &idemstore.Response{
		StatusCode: 201,
		Header:     map[string][]string{"Content-Type": {"application/json"}, "Location": {"/api/payments/pay_123"}},
		Body:       []byte(`{"id":"pay_123","amountCents":2599,"currency":"USD","reference":"order-1001","status":"succeeded"}`),
	}
)

// claimAs claims p and checks the outcome.
func claimAs(ctx context.Context, s idemstore.Store, p idemstore.ClaimParams, want idemstore.ClaimOutcome) error {
	r, err := s.Claim(ctx, p)
	if err != nil {
		return fmt.Errorf("claim %q: %w", p.Key, err)
	}
	if r.Outcome != want {
		return fmt.Errorf("claim %q: outcome %v, want %v", p.Key, r.Outcome, want)
	}
	return nil
}
