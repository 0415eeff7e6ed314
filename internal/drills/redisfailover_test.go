package drills_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/testcluster"
	"github.com/idemhq/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// The Redis failover drill: a service on a Redis Cluster (three masters,
// three replicas) under steady traffic of new keys and duplicates; one
// master is killed (SIGKILL), its replica promoted (cluster-node-timeout
// 2 s), and the dead node restarted empty to rejoin as the new master's
// replica. Then every key is sent once more. It
// reports how many keys executed twice (their record died with the
// master before it reached the replica) and for how long requests were
// refused, with asynchronous replication and with WaitReplicas 1 (every
// write waits for the replica: Redis WAIT). docs/operations.md records
// the results of IDEM_DRILL_LONG=1.
func TestRedisFailoverDrill(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		wait int
	}{{"async", 0}, {"wait1", 1}} {
		// One after the other: each runs six redis-servers under load.
		t.Run(mode.name, func(t *testing.T) {
			cl := testcluster.Start(t)
			client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(),
				DialTimeout: 500 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond})
			t.Cleanup(func() { _ = client.Close() })
			store, err := redisstore.New(client, &redisstore.Config{Prefix: "drill:", WaitReplicas: mode.wait, WaitTimeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			d := newDrill(t, store)
			ctx, stop := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() { defer close(done); d.traffic(ctx, mode.name, 8) }()
			defer func() { stop(); <-done }()

			wait(t.Context(), scale(time.Second, 10*time.Second))
			victim, err := client.MasterForKey(t.Context(), "drill:{victim}")
			if err != nil {
				t.Fatal(err)
			}
			fault := time.Now()
			cl.Kill(victim.Options().Addr)
			hctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			if err := cl.WaitFailover(hctx, victim.Options().Addr); err != nil {
				t.Fatal(err)
			}
			failedOver := time.Since(fault)
			// The dead machine is replaced: it rejoins as a replica of its
			// successor and synchronises.
			cl.Restart(victim.Options().Addr)
			if err := cl.WaitHealthy(hctx); err != nil {
				t.Fatal(err)
			}
			replaced := time.Since(fault)
			wait(t.Context(), scale(time.Second, 10*time.Second))
			stop()
			<-done
			rctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			d.replayAll(rctx)
			if rctx.Err() != nil {
				t.Fatal("the duplicates sent after the drill were still refused after 60 s")
			}
			r := d.result(fault)
			t.Logf("%s: replica promoted %v and the dead node back as a replica %v after the kill; %v",
				mode.name, failedOver.Round(10*time.Millisecond), replaced.Round(10*time.Millisecond), r)
			if r.Refused == 0 {
				t.Error("no request was refused: the kill did not reach the traffic")
			}
			if mode.wait > 0 && r.Duplicates > 0 {
				t.Errorf("%d keys executed twice although every write waited for the replica", r.Duplicates)
			}
		})
	}
}
