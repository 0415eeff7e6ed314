package idem_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/memstore"
)

// BenchmarkEncryption measures what Config.Encryption costs on the two
// paths it touches, through the middleware on memstore as in
// BenchmarkMiddleware: a first execution (seal before Complete) and a
// replay (open after Claim), without encryption ("off"), with AES-256-GCM
// envelopes ("aes") and with key hashing too ("aes+hash").
func BenchmarkEncryption(b *testing.B) {
	modes := []struct {
		name string
		enc  *idemcrypt.Encryption
	}{
		{"off", nil},
		{"aes", newEncryption(b, nil, "1")},
		{"aes+hash", newEncryption(b, &idemcrypt.Config{HashKey: testKey("hash")}, "1")},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) { benchEncryptionMode(b, m.enc) })
	}
}

// benchEncryptionMode sets up one mode's store and middleware, so that a
// mode's records are garbage once it is done and never weigh on the next
// mode's collections.
func benchEncryptionMode(b *testing.B, enc *idemcrypt.Encryption) {
	{
		// The first-execution path in a steady state, as in
		// BenchmarkMiddleware but smaller, to keep the set-up of three
		// modes short: a virtual clock moves 1 ms per request, the TTL is
		// 16 s, and expired records are deleted every 4,096 requests, so
		// the store holds about 16k records.
		var now atomic.Int64
		clock := func() time.Time { return time.Unix(0, now.Load()) }
		store, _ := memstore.New(&memstore.Config{MaxRecords: 1 << 20})
		mw, err := idem.NewMiddleware(store, &idem.Config{TTL: 16 * time.Second, Lease: 5 * time.Second, NowFunc: clock, Encryption: enc})
		if err != nil {
			b.Fatal(err)
		}
		h := mw.Handle(http.HandlerFunc(benchHandler))
		firstKey := steadyKeys(store, &now, "first", 1<<12)
		serve := func(b *testing.B, key string) {
			req, _ := http.NewRequest(http.MethodPost, "http://example.com/api/payments", io.NopCloser(bytes.NewReader(benchBody)))
			req.Pattern = "POST /api/payments"
			req.ContentLength = int64(len(benchBody))
			req.Header["Content-Type"] = []string{"application/json"}
			req.Header["Idempotency-Key"] = []string{key}
			w := &discardWriter{h: make(http.Header)}
			h.ServeHTTP(w, req)
			if w.status != http.StatusCreated {
				b.Fatalf("status %d", w.status)
			}
		}
		for range 20_000 {
			serve(b, firstKey())
		}
		b.Run("first", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				serve(b, firstKey())
			}
		})
		b.Run("replay", func(b *testing.B) {
			const key = `"replay-8e03978e-40d5-43e8-bc93-6894a57f9324"`
			b.ReportAllocs()
			for b.Loop() {
				serve(b, key)
			}
		})
	}
}

// BenchmarkSealOpen measures the envelope alone on a 100-byte response.
func BenchmarkSealOpen(b *testing.B) {
	enc := newEncryption(b, nil, "1")
	ctx := context.Background()
	resp := &idem.Response{StatusCode: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: benchBody}
	b.Run("seal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := enc.Seal(ctx, "8:tenant-1|POST /api/payments", "key", resp); err != nil {
				b.Fatal(err)
			}
		}
	})
	sealed, _ := enc.Seal(ctx, "8:tenant-1|POST /api/payments", "key", resp)
	b.Run("open", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := enc.Open(ctx, "8:tenant-1|POST /api/payments", "key", sealed); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkSealOpenCheckpoint measures the envelope of one recovery point
// of idem serve --provider's size (a payment step and a charge step, about
// 460 bytes): paid once per saved step and once per take-over.
func BenchmarkSealOpenCheckpoint(b *testing.B) {
	enc := newEncryption(b, nil, "1")
	ctx := context.Background()
	cp := bytes.Repeat([]byte("x"), 460)
	cp[0] = '{'
	const scope, fp = "8:tenant-1|POST /api/payments", "v1:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	b.Run("seal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := enc.SealCheckpoint(ctx, scope, "key", fp, cp); err != nil {
				b.Fatal(err)
			}
		}
	})
	sealed, _ := enc.SealCheckpoint(ctx, scope, "key", fp, cp)
	b.Run("open", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := enc.OpenCheckpoint(ctx, scope, "key", fp, sealed); err != nil {
				b.Fatal(err)
			}
		}
	})
}
