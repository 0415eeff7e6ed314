// Package clientbench compares go-redis and rueidis on redisstore's own
// workload: the same Lua scripts (read from ../lua), sent by EVALSHA, for a
// claim plus completion of a new key and for a replay, at 1, 8 and 32
// concurrent workers. It is a separate module so that redisstore does not
// depend on rueidis; run it with the workspace off:
//
//	cd redisstore/clientbench && GOWORK=off go test -run '^$' -bench . -benchtime 10000x -count 5
package clientbench

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

const (
	fp    = "v1:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	lease = "30000"
	ttl   = "60000"
)

// resp is a small JSON 201 response in idem's encoding, as redisstore
// stores it (the bytes matter only for their size here).
var resp = string(make([]byte, 230))

var workers = []int{1, 8, 32}

func addr(tb testing.TB) string {
	u := os.Getenv("IDEM_TEST_REDIS_URL")
	if u == "" {
		u = "redis://127.0.0.1:6379/0"
	}
	o, err := redis.ParseURL(u)
	if err != nil {
		tb.Fatal(err)
	}
	return o.Addr
}

func source(tb testing.TB, name string) string {
	b, err := os.ReadFile("../lua/" + name)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// client abstracts the two clients down to what the scripts need.
type client struct {
	claim    func(ctx context.Context, key, tok string) (int64, error)
	complete func(ctx context.Context, key, tok string) (int64, error)
}

func goRedis(b *testing.B) client {
	c := redis.NewClient(&redis.Options{Addr: addr(b), PoolSize: 64})
	b.Cleanup(func() { _ = c.Close() })
	claim, complete := redis.NewScript(source(b, "claim.lua")), redis.NewScript(source(b, "complete.lua"))
	for _, s := range []*redis.Script{claim, complete} {
		if err := s.Load(b.Context(), c).Err(); err != nil {
			if os.Getenv("CI") == "" {
				b.Skipf("Redis unreachable: %v", err)
			}
			b.Fatal(err)
		}
	}
	return client{
		claim: func(ctx context.Context, key, tok string) (int64, error) {
			v, err := claim.Run(ctx, c, []string{key}, fp, tok, lease, ttl).Slice()
			if err != nil {
				return 0, err
			}
			return v[0].(int64), nil
		},
		complete: func(ctx context.Context, key, tok string) (int64, error) {
			return complete.Run(ctx, c, []string{key}, tok, resp).Int64()
		},
	}
}

func rueidisClient(b *testing.B) client {
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr(b)}, DisableCache: true})
	if err != nil {
		if os.Getenv("CI") == "" {
			b.Skipf("Redis unreachable: %v", err)
		}
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	claim, complete := rueidis.NewLuaScript(source(b, "claim.lua")), rueidis.NewLuaScript(source(b, "complete.lua"))
	return client{
		claim: func(ctx context.Context, key, tok string) (int64, error) {
			v, err := claim.Exec(ctx, c, []string{key}, []string{fp, tok, lease, ttl}).ToArray()
			if err != nil {
				return 0, err
			}
			return v[0].AsInt64()
		},
		complete: func(ctx context.Context, key, tok string) (int64, error) {
			return complete.Exec(ctx, c, []string{key}, []string{tok, resp}).AsInt64()
		},
	}
}

func BenchmarkClaimComplete(b *testing.B) {
	for _, w := range workers {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			prefix := "idembench:" + crand.Text() + ":{"
			op := func(c client) func(context.Context, int) error {
				return func(ctx context.Context, i int) error {
					key, tok := prefix+strconv.Itoa(i)+"}", "t"+strconv.Itoa(i)
					if o, err := c.claim(ctx, key, tok); err != nil || o != 1 {
						return fmt.Errorf("claim: %d %v", o, err)
					}
					if n, err := c.complete(ctx, key, tok); err != nil || n != 1 {
						return fmt.Errorf("complete: %d %v", n, err)
					}
					return nil
				}
			}
			// The two clients write disjoint keys: goredis the even
			// indices' keys, rueidis the odd ones.
			g, r := op(goRedis(b)), op(rueidisClient(b))
			runPaired(b, w,
				func(ctx context.Context, i int) error { return g(ctx, 2*i) },
				func(ctx context.Context, i int) error { return r(ctx, 2*i+1) })
		})
	}
}

func BenchmarkReplay(b *testing.B) {
	for _, w := range workers {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			key := "idembench:" + crand.Text() + ":{replay}"
			g, r := goRedis(b), rueidisClient(b)
			if o, err := g.claim(b.Context(), key, "owner"); err != nil || o != 1 {
				b.Fatalf("claim: %d %v", o, err)
			}
			if n, err := g.complete(b.Context(), key, "owner"); err != nil || n != 1 {
				b.Fatalf("complete: %d %v", n, err)
			}
			op := func(c client) func(context.Context, int) error {
				return func(ctx context.Context, i int) error {
					if o, err := c.claim(ctx, key, "retry"); err != nil || o != 2 {
						return fmt.Errorf("replay: %d %v", o, err)
					}
					return nil
				}
			}
			runPaired(b, w, op(g), op(r))
		})
	}
}

// runPaired runs go-redis's and rueidis's operation b.N times each over w
// workers, in alternating chunks (alternating which goes first) so that
// outside load falls on both alike, and reports each one's ops/s, p50 and
// p99, and the ratio rueidis/goredis. The keys written expire with the
// scripts' one-minute retention.
func runPaired(b *testing.B, w int, goredisOp, rueidisOp func(context.Context, int) error) {
	sides := []*side{{name: "goredis", op: goredisOp}, {name: "rueidis", op: rueidisOp}}
	chunk := 50 * w
	b.ResetTimer()
	for done, round := 0, 0; done < b.N; round++ {
		n := min(chunk, b.N-done)
		for k := range sides {
			sides[(k+round)%2].run(b, w, done, n)
		}
		done += n
	}
	b.StopTimer()
	for _, sd := range sides {
		slices.Sort(sd.lat)
		b.ReportMetric(sd.opsPerSec(), sd.name+"-ops/s")
		b.ReportMetric(float64(sd.lat[len(sd.lat)/2])/1e3, sd.name+"-p50-µs")
		b.ReportMetric(float64(sd.lat[len(sd.lat)*99/100])/1e3, sd.name+"-p99-µs")
	}
	b.ReportMetric(sides[1].opsPerSec()/sides[0].opsPerSec(), "rueidis/goredis")
}

type side struct {
	name    string
	op      func(context.Context, int) error
	elapsed time.Duration
	lat     []time.Duration
}

func (sd *side) opsPerSec() float64 { return float64(len(sd.lat)) / sd.elapsed.Seconds() }

func (sd *side) run(b *testing.B, w, from, n int) {
	var next atomic.Int64
	next.Store(int64(from))
	lat := make([][]time.Duration, w)
	errs := make([]error, w)
	var wg sync.WaitGroup
	start := time.Now()
	for g := range w {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= from+n {
					return
				}
				t0 := time.Now()
				if err := sd.op(b.Context(), i); err != nil {
					errs[g] = err
					return
				}
				lat[g] = append(lat[g], time.Since(t0))
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
