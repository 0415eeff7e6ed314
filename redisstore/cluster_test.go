package redisstore_test

import (
	"context"
	crand "crypto/rand"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/internal/testcluster"
	"github.com/idemhq/idem/redisstore"
	"github.com/idemhq/idem/storetest"
	"github.com/redis/go-redis/v9"
)

// newClusterClient returns a cluster client of c, closed when tb ends.
func newClusterClient(tb testing.TB, c *testcluster.Cluster) *redis.ClusterClient {
	tb.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	tb.Cleanup(func() { _ = client.Close() })
	return client
}

// The whole conformance suite against a real Redis Cluster of three masters
// and three replicas: every script touches one key, whose {hash tag} puts it
// in one slot, so no command fails with CROSSSLOT and the records of
// different keys spread over the masters.
func TestClusterConformance(t *testing.T) {
	t.Parallel()
	cl := testcluster.Start(t)
	client := newClusterClient(t, cl)
	storetest.Run(t, storetest.Harness{
		NewStore: func(t *testing.T) idem.Store {
			// The cluster is this test's own and ends with it: a fresh
			// prefix isolates the subtests, no cleanup is needed.
			s, err := redisstore.New(client, &redisstore.Config{Prefix: "idemtest:" + crand.Text() + ":"})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		ServerClock:  true,
		SelfExpiring: true,
	})
	t.Run("KeysSpreadOverMasters", func(t *testing.T) {
		s, err := redisstore.New(client, &redisstore.Config{Prefix: "spread:"})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 64 {
			if _, err := s.Claim(t.Context(), idem.ClaimParams{Scope: "t", Key: tokenOf(i), Fingerprint: fpA,
				Token: "owner", Lease: time.Minute, TTL: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
		var mu sync.Mutex
		var holding int
		err = client.ForEachMaster(t.Context(), func(ctx context.Context, m *redis.Client) error {
			n, err := m.DBSize(ctx).Result()
			if n > 0 {
				mu.Lock()
				holding++
				mu.Unlock()
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if holding != 3 {
			t.Errorf("64 records landed on %d of the 3 masters, want all 3", holding)
		}
	})
}

// Two clients of the cluster (two instances of a service) race 64 claims on
// one key: exactly one wins, as on a single Redis.
func TestClusterCrossClientRace(t *testing.T) {
	t.Parallel()
	cl := testcluster.Start(t)
	prefix := "race:"
	var stores []*redisstore.Store
	for range 2 {
		s, err := redisstore.New(newClusterClient(t, cl), &redisstore.Config{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	const n = 64
	results := make([]idem.ClaimResult, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = stores[i%2].Claim(t.Context(), idem.ClaimParams{Scope: "t", Key: "contended",
				Fingerprint: fpA, Token: tokenOf(i), Lease: time.Minute, TTL: time.Hour})
		})
	}
	close(start)
	wg.Wait()
	acquired := 0
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		if r.Outcome == idem.ClaimAcquired {
			acquired++
		} else if r.Outcome != idem.ClaimInFlight {
			t.Fatalf("claim %d: %v", i, r.Outcome)
		}
	}
	if acquired != 1 {
		t.Fatalf("%d claims acquired the key, want exactly 1", acquired)
	}
}
