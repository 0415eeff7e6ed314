package sqlitestore_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/sqlitestore"
)

// BenchmarkStore measures the store's two hot paths on one goroutine: a
// first execution (Claim of a new key, then Complete) and a replay (Claim
// of a completed key).
func BenchmarkStore(b *testing.B) {
	s, err := sqlitestore.Open(context.Background(), filepath.Join(b.TempDir(), "bench.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	resp := &idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"pay_1","amountCents":2599,"currency":"USD","reference":"order-1001"}`)}
	claim := func(key, token string) idem.ClaimParams {
		return idem.ClaimParams{Scope: "0:|POST /api/payments", Key: key, Fingerprint: "v1:abc", Token: token,
			Lease: 30 * time.Second, TTL: time.Hour, Now: time.Now()}
	}
	i := 0 // shared by every run, so that -count never reuses a key
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			i++
			key := "first-" + strconv.Itoa(i)
			p := claim(key, key)
			if r, err := s.Claim(ctx, p); err != nil || r.Outcome != idem.ClaimAcquired {
				b.Fatal(r.Outcome, err)
			}
			if err := s.Complete(ctx, idem.CompleteParams{Scope: p.Scope, Key: key, Token: key, Response: resp, Now: p.Now}); err != nil {
				b.Fatal(err)
			}
		}
	})
	p := claim("replayed", "owner")
	s.Claim(ctx, p)
	s.Complete(ctx, idem.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: resp, Now: p.Now})
	b.Run("replay", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if r, err := s.Claim(ctx, claim("replayed", "other")); err != nil || r.Outcome != idem.ClaimCompleted {
				b.Fatal(r.Outcome, err)
			}
		}
	})
}
