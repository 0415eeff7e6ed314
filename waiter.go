package idem

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/idemhq/idem/idemstore"
)

// waiter waits for an in-flight record to change, through the store's
// Watcher when it has one and otherwise by polling with exponential
// back-off and jitter, until Config.Wait has passed.
type waiter struct {
	e        *Executor
	deadline *time.Timer
	backoff  time.Duration
	timer    *time.Timer
}

const (
	waitBackoffMin = 10 * time.Millisecond
	waitBackoffMax = 500 * time.Millisecond
)

func (e *Executor) newWaiter() *waiter {
	return &waiter{e: e, deadline: time.NewTimer(e.cfg.Wait), backoff: waitBackoffMin}
}

// close stops w's timers; a nil waiter (none was needed) has none.
func (w *waiter) close() {
	if w == nil {
		return
	}
	w.deadline.Stop()
	if w.timer != nil {
		w.timer.Stop()
	}
}

func (w *waiter) wait(ctx context.Context, scope, key string) error {
	var changed <-chan struct{}
	// The registration lasts until wctx ends; StoreTimeout also bounds the
	// Watch call itself.
	wctx, cancel := context.WithTimeout(ctx, w.e.cfg.StoreTimeout)
	defer cancel()
	if w.e.watcher != nil {
		ch, err := w.e.watcher.Watch(wctx, scope, key)
		if err == nil {
			changed = ch
		}
	}
	// Full jitter over [backoff/2, backoff) keeps many waiters from
	// polling in step.
	d := w.backoff/2 + rand.N(w.backoff/2+1)
	w.backoff = min(w.backoff*2, waitBackoffMax)
	if w.timer == nil {
		w.timer = time.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
	select {
	case <-changed:
	case <-w.timer.C:
	case <-w.deadline.C:
		return idemstore.ErrInFlight
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	return nil
}
