package sqlitestore_test

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/idemhq/idem/storetest"
)

// BenchmarkStore measures the store on the shared benchmark of every store
// (storetest.Benchmark), on a fresh file per path:
//
//	go test -run '^$' -bench Store -benchmem .
func BenchmarkStore(b *testing.B) {
	storetest.Benchmark(b, storetest.BenchHarness{
		NewStore: func(b *testing.B) idemstore.Store {
			s, err := sqlitestore.Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"), nil)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		},
	})
}

// BenchmarkClaimTxComplete measures a first execution with its claim in
// the operation's transaction (idem.Config.ClaimInTx, as idem serve runs):
// ClaimTx of a new key, Complete and Commit, one write transaction. The
// frames/op metric is the pages each commit wrote to the WAL
// (wal_autocheckpoint off):
//
//	go test -run '^$' -bench ClaimTxComplete -benchmem .
func BenchmarkClaimTxComplete(b *testing.B) {
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "bench.db")
	s, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if _, err := s.DB().ExecContext(ctx, `PRAGMA wal_autocheckpoint = 0`); err != nil {
		b.Fatal(err)
	}
	resp := &idemstore.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"pay_0123456789abcdefghijklmnop","amountCents":2599,"currency":"USD","reference":"order-1001"}`)}
	n := 0
	op := func() {
		n++
		key := "key-" + strconv.Itoa(n)
		p := idemstore.ClaimParams{Scope: "POST /api/payments", Key: key, Fingerprint: "v1:x", Token: key, Lease: time.Minute, TTL: time.Hour, Now: time.Now()}
		r, tx, err := s.ClaimTx(ctx, p)
		if err != nil || r.Outcome != idemstore.ClaimAcquired {
			b.Fatal(r.Outcome, err)
		}
		if err := tx.Complete(ctx, idemstore.CompleteParams{Scope: p.Scope, Key: key, Token: key, Response: resp, Now: p.Now}); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
	}
	for range 100 {
		op()
	}
	before := walFrames(b, path)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		op()
	}
	b.StopTimer()
	b.ReportMetric(float64(walFrames(b, path)-before)/float64(b.N), "frames/op")
}

// walFrames counts the valid frames of the WAL of the database at path.
func walFrames(b *testing.B, path string) int {
	wal, err := os.ReadFile(path + "-wal")
	if err != nil {
		b.Fatal(err)
	}
	be := binary.BigEndian
	if len(wal) < 32 {
		return 0
	}
	pageSize := int(be.Uint32(wal[8:12]))
	salt1, salt2 := be.Uint32(wal[16:20]), be.Uint32(wal[20:24])
	n := 0
	for off := 32; off+24+pageSize <= len(wal); off += 24 + pageSize {
		if be.Uint32(wal[off+8:off+12]) != salt1 || be.Uint32(wal[off+12:off+16]) != salt2 {
			break
		}
		n++
	}
	return n
}
