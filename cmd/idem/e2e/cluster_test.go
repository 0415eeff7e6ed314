package e2e

import (
	"strings"
	"testing"

	"github.com/idemhq/idem/internal/testcluster"
)

// Two instances with records in one Redis Cluster (three masters, three
// replicas; payments in one PostgreSQL database) are one service:
// simultaneous duplicates spread over them execute once, and both replay
// the one response. The store URL lists two seed nodes, as a deployment
// would.
func TestRedisClusterDuplicatesAcrossInstances(t *testing.T) {
	t.Parallel()
	cl := testcluster.Start(t)
	db := newPGDatabase(t)
	store := "redis+cluster://" + strings.Join(cl.Addrs()[:2], ",") + "?prefix=e2e-cluster:"
	a := startServer(t, "cluster-a", "--db", db.url, "--store", store, "--op-delay", "2s")
	b := startServer(t, "cluster-b", "--db", db.url, "--store", store, "--op-delay", "2s")
	servers := []*server{a, b}
	key := "dup-" + randomName(8)
	body := paymentBody(1999, "order-"+key)
	executed := checkBurst(t, servers, burst(t, servers, 48, key, body))
	checkOnePayment(t, db, executed, servers...)
	if n := db.recordCount(t); n != 0 {
		t.Errorf("%d idempotency records in PostgreSQL, want 0 (they belong in the cluster)", n)
	}
	for _, s := range servers {
		checkReplay(t, executed, mustPay(t, s, key, body))
	}
}
