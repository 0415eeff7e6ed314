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
//
// A renewer costs nothing until its operation outlives a third of its
// lease: it waits in its Executor's renewal schedule (a list, without a
// timer or goroutine of its own), and only a renewal that falls due runs,
// on a goroutine of its own.
type renewer struct {
	// x is the execution, whose executor (x.e) the renewer uses; nil when
	// no renewal was scheduled.
	x      *execution
	ctx    context.Context         // the request's values, without its cancellation
	lease  time.Duration           // the record's names are x.ids
	cancel context.CancelCauseFunc // cancels the operation
	every  time.Duration

	mu       sync.Mutex
	stopped  bool
	lost     bool // the store refused a renewal: another owner has the record
	leaseEnd time.Time
	inflight context.CancelFunc // cancels the renewal in progress

	// Guarded by the schedule's lock.
	due        time.Time // on the monotonic clock
	prev, next *renewer
	queued     bool
}

// start schedules the first renewal of x's lease, claimed with cp; ctx is
// the request's values without its cancellation, cancel ends the
// operation.
func (r *renewer) start(ctx context.Context, x *execution, cp idemstore.ClaimParams, cancel context.CancelCauseFunc) {
	r.ctx, r.x, r.cancel = ctx, x, cancel
	r.lease = cp.Lease
	r.every = cp.Lease / 3
	r.leaseEnd = cp.Now.Add(cp.Lease)
	r.x.e.renewals.add(r)
}

// renew runs one renewal that fell due, and schedules the next.
func (r *renewer) renew() {
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.x.e.cfg.StoreTimeout)
	defer cancel()
	r.inflight = cancel
	r.mu.Unlock()

	ids := &r.x.ids
	p := idemstore.RenewParams{Scope: ids.scope, Key: ids.key, Token: ids.token, Lease: r.lease, Now: r.x.e.cfg.NowFunc()}
	var err error
	if tr := r.x.tx.renewer(); tr != nil {
		err = tr.Renew(ctx, p)
	} else {
		err = r.x.e.store.Renew(ctx, p)
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
		leaseOver = !r.x.e.cfg.NowFunc().Before(r.leaseEnd)
	}
	if !stopped && !r.lost && !leaseOver {
		r.x.e.renewals.add(r) // under r.mu, so that stop finds it queued
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
	op, key := slog.String("operation", r.x.p.Operation), keyAttr(r.x.ids.key)
	switch {
	case err == nil:
		r.x.e.emit(r.ctx, Event{Kind: EventRenewed, Operation: r.x.p.Operation}, r.x.start)
	case errors.Is(err, idemstore.ErrLeaseLost):
		r.cancel(idemstore.ErrLeaseLost)
	case leaseOver:
		// The lease ran out while the store could not be reached: another
		// attempt may own the record now, so the operation must stop.
		r.x.e.cfg.Logger.LogAttrs(r.ctx, slog.LevelWarn, "idem: lease expired while renewals failed; cancelling the operation",
			op, key, slog.Any("error", err))
		r.x.e.emit(r.ctx, Event{Kind: EventStoreError, Operation: r.x.p.Operation, Err: err}, r.x.start)
		r.cancel(idemstore.ErrLeaseLost)
	default:
		r.x.e.cfg.Logger.LogAttrs(r.ctx, slog.LevelWarn, "idem: lease renewal failed; retrying", op, key, slog.Any("error", err))
		r.x.e.emit(r.ctx, Event{Kind: EventStoreError, Operation: r.x.p.Operation, Err: err}, r.x.start)
	}
}

// stop ends renewal without waiting for a renewal in progress, which may be
// queued behind the operation's own transaction: it is cancelled and its
// result ignored.
func (r *renewer) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	if r.x != nil { // nil when no renewal was scheduled (an uncommitted claim)
		r.x.e.renewals.remove(r)
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

// renewals is an Executor's renewal schedule: the renewers of its running
// operations in the order their renewals fall due, and one timer, armed
// for the earliest. An operation that ends before its first renewal only
// joins and leaves the list: no timer of its own (two allocations and a
// runtime timer per call, docs/BENCHMARKS.md) and no goroutine. A renewal
// that falls due runs on a goroutine of its own, so that a store that
// stalls one renewal delays no other; each is bounded by StoreTimeout.
//
// Lock order: a renewer's lock, then the schedule's.
type renewals struct {
	mu         sync.Mutex
	head, tail *renewer
	timer      *time.Timer // made on first use
	armed      time.Time   // when the timer fires; zero if it is not armed
}

// add schedules r's next renewal a third of a lease from now.
func (s *renewals) add(r *renewer) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	r.due = now.Add(r.every)
	// Every operation of an Executor has the same lease, so a renewal
	// joins at the tail; the walk keeps the order for any other.
	at := s.tail
	for at != nil && at.due.After(r.due) {
		at = at.prev
	}
	r.prev, r.queued = at, true
	if at == nil {
		r.next, s.head = s.head, r
	} else {
		r.next, at.next = at.next, r
	}
	if r.next == nil {
		s.tail = r
	} else {
		r.next.prev = r
	}
	if s.head == r && (s.armed.IsZero() || r.due.Before(s.armed)) {
		s.arm(r.due.Sub(now), r.due)
	}
}

// remove takes r out of the schedule, if it is there. The timer stays
// armed: when it fires for nothing, it re-arms for the new head.
func (s *renewals) remove(r *renewer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !r.queued {
		return
	}
	if r.prev == nil {
		s.head = r.next
	} else {
		r.prev.next = r.next
	}
	if r.next == nil {
		s.tail = r.prev
	} else {
		r.next.prev = r.prev
	}
	r.prev, r.next, r.queued = nil, nil, false
}

// arm sets the timer to fire after d, at due. The caller holds s.mu.
func (s *renewals) arm(d time.Duration, due time.Time) {
	s.armed = due
	if s.timer == nil {
		s.timer = time.AfterFunc(d, s.fire)
		return
	}
	s.timer.Reset(d)
}

// fire starts the renewals that are due and re-arms the timer for the
// next.
func (s *renewals) fire() {
	now := time.Now()
	s.mu.Lock()
	s.armed = time.Time{}
	var due []*renewer
	for s.head != nil && !s.head.due.After(now) {
		r := s.head
		s.head = r.next
		r.prev, r.next, r.queued = nil, nil, false
		due = append(due, r)
	}
	if s.head == nil {
		s.tail = nil
	} else {
		s.head.prev = nil
		s.arm(s.head.due.Sub(now), s.head.due)
	}
	s.mu.Unlock()
	for _, r := range due {
		go r.renew()
	}
}
