package idem_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/memstore"
)

func BenchmarkExecutorDo(b *testing.B) {
	store, _ := memstore.New(&memstore.Config{MaxRecords: 1 << 26})
	exec, _ := idem.NewExecutor(store, nil)
	resp := &idem.Response{StatusCode: 201, Body: []byte("ok")}
	op := func(context.Context) (*idem.Response, error) { return resp, nil }
	ctx := context.Background()
	next := 0 // shared by every run of "first", so that -count never reuses a key
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			next++
			exec.Do(ctx, idem.DoParams{Scope: "s", Key: strconv.Itoa(next), Fingerprint: "v1:x"}, op)
		}
	})
	b.Run("replay", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			exec.Do(ctx, idem.DoParams{Scope: "s", Key: "1", Fingerprint: "v1:x"}, op)
		}
	})
}
