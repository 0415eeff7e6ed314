package drills_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/internal/testcluster"
	"github.com/idemhq/idem/memstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// TestSizing measures what docs/operations.md reports for capacity
// planning: records per second (claim + complete of new keys, 8 workers)
// and bytes per completed record, for every store. It is a measurement, not
// a check, so it runs only when IDEM_SIZING_RECORDS gives the number of
// records to write per store:
//
//	cd internal/drills && IDEM_SIZING_RECORDS=50000 go test -run TestSizing -v .
func TestSizing(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("IDEM_SIZING_RECORDS"))
	if n <= 0 {
		t.Skip("set IDEM_SIZING_RECORDS=N to measure (docs/operations.md)")
	}
	// Stores run one after the other so that they do not share the CPU.
	t.Run("Memory", func(t *testing.T) {
		s, err := memstore.New(&memstore.Config{MaxRecords: 2 * n})
		if err != nil {
			t.Fatal(err)
		}
		before := heap()
		rate := fill(t, s, n)
		report(t, "memstore", n, rate, int64(heap()-before), "Go heap in use after GC")
		runtime.KeepAlive(s)
	})
	t.Run("SQLite", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "idem.db")
		s, err := sqlitestore.Open(t.Context(), path, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		rate := fill(t, s, n)
		if _, err := s.ReadDB().ExecContext(t.Context(), "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		report(t, "sqlitestore", n, rate, fi.Size(), "database file after a WAL checkpoint")
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		pool := newPool(t, postgresURL())
		schema := newSchemaName()
		s := newPGStore(t, pool, pgstore.Config{Schema: schema})
		rate := fill(t, s, n)
		var size int64
		// The records table with its indexes and TOAST.
		q := `SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c JOIN pg_namespace ns ON ns.oid = c.relnamespace
		      WHERE ns.nspname = $1 AND c.relkind = 'r'`
		if _, err := pool.Exec(t.Context(), "VACUUM ANALYZE "+pgx.Identifier{schema, pgstore.DefaultTable}.Sanitize()); err != nil {
			t.Logf("vacuum: %v", err)
		}
		if err := pool.QueryRow(t.Context(), q, schema).Scan(&size); err != nil {
			t.Fatal(err)
		}
		report(t, "pgstore", n, rate, size, "tables, indexes and TOAST of the schema")
	})
	t.Run("Redis", func(t *testing.T) {
		// A private cluster, so that used_memory counts only these records.
		cl := testcluster.Start(t)
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), MaintNotificationsConfig: noMaint()})
		defer c.Close()
		before := redisMemory(t, c)
		rate := fill(t, newRedisStore(t, c, "size:"), n)
		report(t, "redisstore (cluster)", n, rate, redisMemory(t, c)-before, "used_memory of the three masters")
	})
}

// fill claims and completes n new keys with 8 workers and returns records
// per second. The response is a typical API answer: 201, a JSON content
// type and location, a 90-byte body.
func fill(t *testing.T, s idemstore.Store, n int) float64 {
	resp := &idemstore.Response{StatusCode: 201, Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/payments/pay_0123456789"}},
		Body: []byte(`{"id":"pay_0123456789","amount_cents":1999,"currency":"EUR","status":"succeeded","ref":"x"}`)}
	fp := idem.FingerprintVersion + ":" + strings.Repeat("ab", 32)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	now := time.Now() // server-clock stores ignore it
	for range 8 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				key := fmt.Sprintf("%08d-2c1f5e9a-4b7d-4e0c-9f3a-7d2b1c0e5f6a", i) // a UUID-sized key
				tok := fmt.Sprintf("token-%022d", i)
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				_, err := s.Claim(ctx, idemstore.ClaimParams{Scope: idem.Scope("tenant-1", "POST /payments"), Key: key,
					Fingerprint: fp, Token: tok, Lease: time.Minute, TTL: 24 * time.Hour, Now: now})
				if err == nil {
					// A response of its own, as the middleware gives: memstore
					// keeps it.
					own := &idemstore.Response{StatusCode: resp.StatusCode, Header: resp.Header.Clone(), Body: slices.Clone(resp.Body)}
					err = s.Complete(ctx, idemstore.CompleteParams{Scope: idem.Scope("tenant-1", "POST /payments"), Key: key,
						Token: tok, Response: own, Now: now})
				}
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return float64(n) / time.Since(start).Seconds()
}

func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func redisMemory(t *testing.T, c *redis.ClusterClient) int64 {
	var total atomic.Int64
	err := c.ForEachMaster(t.Context(), func(ctx context.Context, m *redis.Client) error {
		v, err := m.InfoMap(ctx, "memory").Result()
		if err != nil {
			return err
		}
		n, err := strconv.ParseInt(v["Memory"]["used_memory"], 10, 64)
		total.Add(n)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return total.Load()
}

func report(t *testing.T, store string, n int, rate float64, bytes int64, what string) {
	t.Logf("SIZING %s: %d records at %.0f records/s (8 workers); %d bytes/record (%s); %.0f MiB per million records",
		store, n, rate, bytes/int64(n), what, float64(bytes)/float64(n)*1e6/(1<<20))
}
