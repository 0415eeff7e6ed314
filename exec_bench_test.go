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
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			exec.Do(ctx, idem.DoParams{Scope: "s", Key: strconv.Itoa(i), Fingerprint: "v1:x"}, op)
		}
	})
	b.Run("replay", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			exec.Do(ctx, idem.DoParams{Scope: "s", Key: "1", Fingerprint: "v1:x"}, op)
		}
	})
}
