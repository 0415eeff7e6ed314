package idem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/idemhq/idem/idemstore"
)

// renewer keeps the lease alive while the operation runs: every third of a
// lease it renews through the store (or the open transaction, for stores
// that serialise writers). If the store says the lease is lost, or renewals
// keep failing until the lease has run out, it cancels the operation's
// context with cause ErrLeaseLost. Its lock guards its fields only: it is
// never held across a store call, an observer or a log handler.
type renewer struct {
	e      *Executor
	ctx    context.Context // the request's values, without its cancellation
	x      *execution
	params idemstore.RenewParams
	cancel context.CancelCauseFunc // cancels the operation
	every  time.Duration

	mu       sync.Mutex
	timer    *time.Timer
	stopped  bool
	lost     bool // the store refused a renewal: another owner has the record
	leaseEnd time.Time
	inflight context.CancelFunc // cancels the renewal in progress
}

// start arms the first renewal of x's lease, claimed with cp; ctx is the
// request's values without its cancellation, cancel ends the operation.
func (r *renewer) start(ctx context.Context, x *execution, cp idemstore.ClaimParams, cancel context.CancelCauseFunc) {
	r.e, r.ctx, r.x, r.cancel = x.e, ctx, x, cancel
	r.params = idemstore.RenewParams{Scope: cp.Scope, Key: cp.Key, Token: cp.Token, Lease: cp.Lease}
	r.every = cp.Lease / 3
	r.leaseEnd = cp.Now.Add(cp.Lease)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timer = time.AfterFunc(r.every, r.fire)
}

func (r *renewer) fire() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.e.cfg.StoreTimeout)
	defer cancel()
	r.inflight = cancel
	r.mu.Unlock()

	p := r.params
	p.Now = r.e.cfg.NowFunc()
	var err error
	if tr := r.x.tx.renewer(); tr != nil {
		err = tr.Renew(ctx, p)
	} else {
		err = r.e.store.Renew(ctx, p)
	}

	r.mu.Lock()
	stopped, leaseOver := r.stopped, false
	switch {
	case stopped:
		// The operation has returned; this renewal no longer matters.
	case err == nil:
		r.leaseEnd = p.Now.Add(p.Lease)
	case errors.Is(err, idemstore.ErrLeaseLost):
		r.lost = true
	default:
		leaseOver = !r.e.cfg.NowFunc().Before(r.leaseEnd)
	}
	if !stopped && !r.lost && !leaseOver {
		r.timer.Reset(r.every)
	}
	r.inflight = nil
	r.mu.Unlock()

	if !stopped {
		r.report(err, leaseOver)
	}
}

// report tells the observer and the log how a renewal went, and cancels
// the operation if its lease is gone. It runs outside the renewer's lock.
func (r *renewer) report(err error, leaseOver bool) {
	op, key := slog.String("operation", r.x.p.Operation), keyAttr(r.params.Key)
	switch {
	case err == nil:
		r.e.emit(r.ctx, Event{Kind: EventRenewed, Operation: r.x.p.Operation}, r.x.start)
	case errors.Is(err, idemstore.ErrLeaseLost):
		r.cancel(idemstore.ErrLeaseLost)
	case leaseOver:
		// The lease ran out while the store could not be reached: another
		// attempt may own the record now, so the operation must stop.
		r.e.cfg.Logger.LogAttrs(r.ctx, slog.LevelWarn, "idem: lease expired while renewals failed; cancelling the operation",
			op, key, slog.Any("error", err))
		r.e.emit(r.ctx, Event{Kind: EventStoreError, Operation: r.x.p.Operation, Err: err}, r.x.start)
		r.cancel(idemstore.ErrLeaseLost)
	default:
		r.e.cfg.Logger.LogAttrs(r.ctx, slog.LevelWarn, "idem: lease renewal failed; retrying", op, key, slog.Any("error", err))
		r.e.emit(r.ctx, Event{Kind: EventStoreError, Operation: r.x.p.Operation, Err: err}, r.x.start)
	}
}

// stop ends renewal without waiting for a renewal in progress, which may be
// queued behind the operation's own transaction: it is cancelled and its
// result ignored.
func (r *renewer) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	if r.timer != nil { // nil when no renewal ran (an uncommitted claim)
		r.timer.Stop()
	}
	if r.inflight != nil {
		r.inflight()
	}
}

// lostByStore reports that the store refused a renewal because the token no
// longer owns the record.
func (r *renewer) lostByStore() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lost
}
