package backend

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/internal/testcluster"
)

func TestKindOfRedisCluster(t *testing.T) {
	for _, spec := range []string{"redis+cluster://a:1,b:2", "rediss+cluster://u:p@a:1", "Redis+Cluster://a:1"} {
		if k, err := KindOf(spec); err != nil || k != RedisCluster {
			t.Errorf("KindOf(%q) = %q, %v, want %q", spec, k, err, RedisCluster)
		}
	}
}

func TestOpenRedisClusterRefusesBadURLs(t *testing.T) {
	for _, spec := range []string{
		"redis+cluster://127.0.0.1:1/2",                    // a database number
		"redis+cluster://127.0.0.1:1?wait_replicas=x",      // not a number
		"redis+cluster://127.0.0.1:1?wait_timeout=soon",    // not a duration
		"redis+cluster://127.0.0.1:1?wait_replicas=-1",     // negative
		"redis+cluster://127.0.0.1:1?prefix=%7Bx%7D",       // a hash tag in the prefix
		"redis+cluster://127.0.0.1:1?dial_timeout=forever", // go-redis refuses it
	} {
		if s, err := Open(t.Context(), spec); err == nil {
			s.Close()
			t.Errorf("Open(%q) succeeded", spec)
		}
	}
}

// A store opened from a redis+cluster:// URL naming two seed nodes works on
// the whole cluster, with and without waiting for replicas.
func TestOpenRedisCluster(t *testing.T) {
	cl := testcluster.Start(t)
	seeds := strings.Join(cl.Addrs()[:2], ",")
	for _, query := range []string{"?prefix=plain:", "?prefix=wait:&wait_replicas=1&wait_timeout=5s"} {
		s, err := Open(t.Context(), "redis+cluster://"+seeds+query)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		if err := s.Ping(ctx); err != nil {
			t.Fatalf("Ping: %v", err)
		}
		if s.Kind != RedisCluster || !strings.HasPrefix(s.Where, "Redis Cluster ") {
			t.Errorf("Kind %q, Where %q", s.Kind, s.Where)
		}
		for i := range 8 {
			p := idemstore.ClaimParams{Scope: "t", Key: string(rune('a' + i)), Fingerprint: "v1:x", Token: "o",
				Lease: time.Minute, TTL: time.Hour}
			if r, err := s.Records.Claim(ctx, p); err != nil || r.Outcome != idemstore.ClaimAcquired {
				t.Fatalf("%s: Claim = %v, %v", query, r.Outcome, err)
			}
		}
		cancel()
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	}
}
