package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
)

// watchTimeout bounds how long a watch may take to fire after the change
// it reports; a store that never fires fails instead of hanging.
const watchTimeout = 10 * time.Second

func testWatch(t *testing.T, h Harness) {
	probe := h.NewStore(t)
	if _, ok := probe.(idemstore.Watcher); !ok {
		t.Skip("the store does not implement idemstore.Watcher")
	}
	watch := func(b *bundle, p idemstore.ClaimParams) <-chan struct{} {
		b.t.Helper()
		ch, err := b.store.(idemstore.Watcher).Watch(b.ctx, p.Scope, p.Key)
		if err != nil {
			b.t.Fatalf("Watch: %v", err)
		}
		return ch
	}
	fired := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-time.After(watchTimeout):
			return false
		}
	}

	t.Run("FiresOnComplete", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		ch := watch(b, p)
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if !fired(ch) {
			t.Fatal("watch did not fire after Complete")
		}
	})

	t.Run("FiresOnRelease", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		ch := watch(b, p)
		if err := b.release(p); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if !fired(ch) {
			t.Fatal("watch did not fire after Release")
		}
	})

	t.Run("FiresAtOnceWhenNotInFlight", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if !fired(watch(b, p)) {
			t.Fatal("watch of a completed record did not fire")
		}
		scope, key := b.names()
		if !fired(watch(b, idemstore.ClaimParams{Scope: scope, Key: key})) {
			t.Fatal("watch of an absent record did not fire")
		}
	})

	t.Run("EndsWithContext", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		ctx, cancel := context.WithCancel(b.ctx)
		if _, err := b.store.(idemstore.Watcher).Watch(ctx, p.Scope, p.Key); err != nil {
			t.Fatalf("Watch: %v", err)
		}
		cancel()
		// The store must stay usable after a cancelled watch.
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("Complete after a cancelled watch: %v", err)
		}
	})
}
