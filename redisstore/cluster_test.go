package redisstore_test

import (
	"context"
	crand "crypto/rand"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/internal/testcluster"
	"github.com/idemhq/idem/redisstore"
	"github.com/idemhq/idem/storetest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// newClusterClient returns a cluster client of c, closed when tb ends.
func newClusterClient(tb testing.TB, c *testcluster.Cluster) *redis.ClusterClient {
	tb.Helper()
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(),
		// go-redis v9.23 races on the maintenance-notification handshake
		// with the dedicated connections WaitReplicas uses.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}})
	tb.Cleanup(func() { _ = client.Close() })
	return client
}

// One real Redis Cluster of three masters and three replicas for every
// cluster test, started once (a start costs seconds of the machine's time).
func TestCluster(t *testing.T) {
	t.Parallel()
	cl := testcluster.Start(t)
	t.Run("Conformance", func(t *testing.T) { t.Parallel(); testClusterConformance(t, cl) })
	t.Run("CrossClientRace", func(t *testing.T) { t.Parallel(); testClusterCrossClientRace(t, cl) })
	t.Run("WaitReplicas", func(t *testing.T) { t.Parallel(); testClusterWaitReplicas(t, cl) })
}

// The whole conformance suite against the cluster: every script touches one
// key, whose {hash tag} puts it in one slot, so no command fails with
// CROSSSLOT and the records of different keys spread over the masters.
func testClusterConformance(t *testing.T, cl *testcluster.Cluster) {
	client := newClusterClient(t, cl)
	storetest.Run(t, storetest.Harness{
		NewStore: func(t *testing.T) idemstore.Store {
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
		HashedKeys:   true,
		ScanOrder:    true,
	})
	t.Run("KeysSpreadOverMasters", func(t *testing.T) {
		s, err := redisstore.New(client, &redisstore.Config{Prefix: "spread:"})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 64 {
			if _, err := s.Claim(t.Context(), idemstore.ClaimParams{Scope: "t", Key: tokenOf(i), Fingerprint: fpA,
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
func testClusterCrossClientRace(t *testing.T, cl *testcluster.Cluster) {
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
	results := make([]idemstore.ClaimResult, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = stores[i%2].Claim(t.Context(), idemstore.ClaimParams{Scope: "t", Key: "contended",
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
		if r.Outcome == idemstore.ClaimAcquired {
			acquired++
		} else if r.Outcome != idemstore.ClaimInFlight {
			t.Fatalf("claim %d: %v", i, r.Outcome)
		}
	}
	if acquired != 1 {
		t.Fatalf("%d claims acquired the key, want exactly 1", acquired)
	}
}

// With WaitReplicas every write waits for the master's replica: one replica
// acknowledges, so the whole lifecycle works; two cannot (each master has
// one), so every write fails with ErrNotReplicated rather than being
// confirmed.
func testClusterWaitReplicas(t *testing.T, cl *testcluster.Cluster) {
	client := newClusterClient(t, cl)
	one, err := redisstore.New(client, &redisstore.Config{Prefix: "wait1:", WaitReplicas: 1, WaitTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 16 { // keys on every master
		p := idemstore.ClaimParams{Scope: "t", Key: tokenOf(i), Fingerprint: fpA, Token: "owner", Lease: time.Minute, TTL: time.Hour}
		if r, err := one.Claim(t.Context(), p); err != nil || r.Outcome != idemstore.ClaimAcquired {
			t.Fatalf("Claim with WaitReplicas 1: %v %v", r.Outcome, err)
		}
		if err := one.Renew(t.Context(), idemstore.RenewParams{Scope: "t", Key: p.Key, Token: "owner", Lease: time.Minute}); err != nil {
			t.Fatalf("Renew with WaitReplicas 1: %v", err)
		}
		if err := one.Complete(t.Context(), idemstore.CompleteParams{Scope: "t", Key: p.Key, Token: "owner", Response: &idemstore.Response{StatusCode: 201}}); err != nil {
			t.Fatalf("Complete with WaitReplicas 1: %v", err)
		}
		p.Token = "retry"
		if r, err := one.Claim(t.Context(), p); err != nil || r.Outcome != idemstore.ClaimCompleted {
			t.Fatalf("retry with WaitReplicas 1: %v %v", r.Outcome, err)
		}
	}
	two, err := redisstore.New(client, &redisstore.Config{Prefix: "wait2:", WaitReplicas: 2, WaitTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = two.Claim(t.Context(), idemstore.ClaimParams{Scope: "t", Key: "k", Fingerprint: fpA, Token: "owner", Lease: time.Minute, TTL: time.Hour})
	if !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Claim with WaitReplicas 2 of 1 replica = %v, want ErrNotReplicated", err)
	}
}

// WAIT needs the write and the wait on one connection, which only a
// *redis.Client or a *redis.ClusterClient can give.
func TestWaitReplicasConfig(t *testing.T) {
	t.Parallel()
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}})
	t.Cleanup(func() { _ = ring.Close() })
	if _, err := redisstore.New(ring, &redisstore.Config{WaitReplicas: 1}); err == nil {
		t.Error("New accepted WaitReplicas with a ring client")
	}
	if _, err := redisstore.New(ring, nil); err != nil {
		t.Errorf("New without WaitReplicas on a ring client: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	for _, cfg := range []redisstore.Config{{WaitReplicas: -1}, {WaitReplicas: 1, WaitTimeout: -time.Second}} {
		if _, err := redisstore.New(c, &cfg); err == nil {
			t.Errorf("New accepted %+v", cfg)
		}
	}
}

// The shared test Redis has no replica: a store that waits for one refuses
// to confirm the claim.
func TestWaitReplicasWithoutReplica(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, &redisstore.Config{WaitReplicas: 1, WaitTimeout: 10 * time.Millisecond})
	_, err := s.Claim(t.Context(), idemstore.ClaimParams{Scope: "t", Key: "k", Fingerprint: fpA, Token: "owner", Lease: time.Minute, TTL: time.Hour})
	if !errors.Is(err, redisstore.ErrNotReplicated) {
		t.Fatalf("Claim = %v, want ErrNotReplicated", err)
	}
}
