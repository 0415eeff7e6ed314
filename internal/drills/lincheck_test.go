package drills_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/internal/drills"
	"github.com/idemhq/idem/internal/testcluster"
	"github.com/idemhq/idem/memstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/redis/go-redis/v9"
)

// fakeClockHistory shapes histories for stores that take Now from their
// parameters: the fake clock moves up to a fifth of a lease per operation,
// so leases expire and records end within a history.
func fakeClockHistory(seed uint64) drills.HistoryConfig {
	return drills.HistoryConfig{Clients: 4, Ops: scale(120, 1000), Keys: 3,
		Lease: time.Second, TTL: 2 * time.Second, Pause: 200 * time.Millisecond, Seed: seed}
}

// serverClockHistory shapes histories for stores that use their server's
// clock: real time passes, so leases are short.
func serverClockHistory(seed uint64, slack time.Duration) drills.HistoryConfig {
	return drills.HistoryConfig{Clients: 4, Ops: scale(60, 400), Keys: 4,
		Lease: 100 * time.Millisecond, TTL: 300 * time.Millisecond, Pause: 25 * time.Millisecond,
		ServerClock: true, Slack: slack, Seed: seed}
}

// checkStore records histories on fresh stores from newStore and checks
// each against the Store contract.
func checkStore(t *testing.T, newStore func(t *testing.T) idemstore.Store, cfg func(seed uint64) drills.HistoryConfig) {
	for seed := range uint64(scale(2, 10)) {
		h := drills.Record(t.Context(), newStore(t), cfg(seed))
		if n := drills.Unknowns(h); n > 0 {
			t.Errorf("seed %d: %d operations failed without a fault injected", seed, n)
		}
		drills.Check(t, "seed-"+itoa(int(seed)), h)
		t.Logf("seed %d: %v", seed, drills.Outcomes(h))
	}
}

// Random concurrent histories of claim, renew, complete, release and lease
// and retention expiry on every store are linearizable against the model of
// the Store contract (drills.Model).
func TestLinearizable(t *testing.T) {
	t.Parallel()
	t.Run("Memory", func(t *testing.T) {
		t.Parallel()
		checkStore(t, func(t *testing.T) idemstore.Store {
			s, err := memstore.New(nil)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, fakeClockHistory)
	})
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		checkStore(t, func(t *testing.T) idemstore.Store {
			s, err := sqlitestore.Open(t.Context(), filepath.Join(t.TempDir(), "idem.db"), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			return s
		}, func(seed uint64) drills.HistoryConfig {
			// A take-over waits at most 100 ms for SQLite's write lock,
			// then answers "in flight" (store.go, Claim).
			c := fakeClockHistory(seed)
			c.BusyInFlight = true
			return c
		})
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t, postgresURL())
		checkStore(t, func(t *testing.T) idemstore.Store { return newPGStore(t, pool, pgstore.Config{}) },
			func(seed uint64) drills.HistoryConfig { return serverClockHistory(seed, 2*time.Millisecond) })
	})
	t.Run("MariaDB", func(t *testing.T) {
		t.Parallel()
		db := newMyDB(t, mysqlConfig(t))
		checkStore(t, func(t *testing.T) idemstore.Store { return newMyStore(t, db, "") },
			func(seed uint64) drills.HistoryConfig { return serverClockHistory(seed, 2*time.Millisecond) })
	})
	t.Run("Redis", func(t *testing.T) {
		t.Parallel()
		c := newRedis(t)
		checkStore(t, func(t *testing.T) idemstore.Store { return newRedisStore(t, c, redisPrefix(t, c)) },
			// Redis's TIME is read in milliseconds.
			func(seed uint64) drills.HistoryConfig { return serverClockHistory(seed, 2*time.Millisecond) })
	})
	t.Run("RedisCluster", func(t *testing.T) {
		t.Parallel()
		cl := testcluster.Start(t)
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaintNotificationsConfig: noMaint()})
		t.Cleanup(func() { _ = c.Close() })
		n := 0
		checkStore(t, func(t *testing.T) idemstore.Store {
			n++
			return newRedisStore(t, c, "lin"+itoa(n)+":")
		}, func(seed uint64) drills.HistoryConfig { return serverClockHistory(seed, 2*time.Millisecond) })
	})
}

func newRedisStore(t *testing.T, c redis.UniversalClient, prefix string) *redisstore.Store {
	s, err := redisstore.New(c, &redisstore.Config{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The checker catches a store that breaks the contract: one that lets a
// second claim acquire a key under a live lease (as a non-atomic
// read-then-write would), and one that replays another record's response.
func TestCheckerCatchesBrokenStores(t *testing.T) {
	t.Parallel()
	for name, wrap := range map[string]func(idemstore.Store) idemstore.Store{
		"DoubleAcquire": func(s idemstore.Store) idemstore.Store { return doubleAcquire{s} },
		"WrongReplay":   func(s idemstore.Store) idemstore.Store { return wrongReplay{Store: s} },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m, err := memstore.New(nil)
			if err != nil {
				t.Fatal(err)
			}
			h := drills.Record(t.Context(), wrap(m), fakeClockHistory(7))
			res, info := porcupine.CheckOperationsVerbose(drills.Model(), h, time.Minute)
			if res != porcupine.Illegal {
				t.Fatalf("history on a %s store checked %v, want Illegal", name, res)
			}
			// What Check saves for a failing history renders.
			path := filepath.Join(t.TempDir(), "history.html")
			if err := porcupine.VisualizePath(drills.Model(), info, path); err != nil {
				t.Fatal(err)
			}
			if fi, err := os.Stat(path); err != nil || fi.Size() < 1000 {
				t.Fatalf("visualisation %s: %v", path, err)
			}
		})
	}
}

// doubleAcquire answers ClaimAcquired where the store answered
// ClaimInFlight.
type doubleAcquire struct{ idemstore.Store }

func (s doubleAcquire) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	r, err := s.Store.Claim(ctx, p)
	if r.Outcome == idemstore.ClaimInFlight {
		r.Outcome = idemstore.ClaimAcquired
	}
	return r, err
}

// wrongReplay replays another request's body for every completed key.
type wrongReplay struct {
	idemstore.Store
}

func (s wrongReplay) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	r, err := s.Store.Claim(ctx, p)
	if r.Outcome == idemstore.ClaimCompleted {
		r.Record.Response = &idemstore.Response{StatusCode: 201, Body: []byte("resp-of-another-request")}
	}
	return r, err
}

// The model itself, on hand-written histories.
func TestModel(t *testing.T) {
	t.Parallel()
	const L, TTL = 100, 1000
	claim := func(tok string, at int64) drills.Input {
		return drills.Input{Op: drills.OpClaim, Key: "k", Fingerprint: "v1:a", Token: tok, Lease: L, TTL: TTL, TLo: at, THi: at}
	}
	op := func(client int, in drills.Input, outcome string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Input: in, Output: drills.Output{Outcome: outcome}, Call: call, Return: ret}
	}
	for _, tc := range []struct {
		name string
		ok   bool
		h    []porcupine.Operation
	}{
		{"two acquire under a live lease", false, []porcupine.Operation{
			op(0, claim("a", 10), drills.OutAcquired, 0, 1), op(1, claim("b", 20), drills.OutAcquired, 2, 3)}},
		{"takeover after the lease", true, []porcupine.Operation{
			op(0, claim("a", 10), drills.OutAcquired, 0, 1), op(1, claim("b", 110), drills.OutTookOver, 2, 3)}},
		{"takeover before the lease ends", false, []porcupine.Operation{
			op(0, claim("a", 10), drills.OutAcquired, 0, 1), op(1, claim("b", 109), drills.OutTookOver, 2, 3)}},
		{"stale owner completes", false, []porcupine.Operation{
			op(0, claim("a", 10), drills.OutAcquired, 0, 1), op(1, claim("b", 200), drills.OutTookOver, 2, 3),
			op(0, drills.Input{Op: drills.OpComplete, Key: "k", Token: "a", Body: "x", TLo: 201, THi: 201}, drills.OutOK, 4, 5)}},
		{"concurrent claims, either wins", true, []porcupine.Operation{
			op(0, claim("a", 10), drills.OutInFlight, 0, 10), op(1, claim("b", 10), drills.OutAcquired, 1, 9)}},
		{"unknown claim may have acquired", true, []porcupine.Operation{
			op(0, claim("a", 10), drills.OutUnknown, 0, drills.Forever), op(1, claim("b", 20), drills.OutInFlight, 2, 3)}},
		{"retention ended", true, []porcupine.Operation{
			op(0, claim("a", 10), drills.OutAcquired, 0, 1), op(1, claim("b", 1010), drills.OutAcquired, 2, 3)}},
	} {
		got := porcupine.CheckOperations(drills.Model(), tc.h)
		if got != tc.ok {
			t.Errorf("%s: linearizable = %v, want %v", tc.name, got, tc.ok)
		}
	}
}
