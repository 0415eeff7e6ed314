package idem

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Errors returned by Executor.Do. The middleware maps each to its HTTP
// answer.
var (
	// ErrInFlight: another attempt with the same key is running (409).
	ErrInFlight = errors.New("idem: a request with this key is in progress")

	// ErrFingerprintMismatch: the key was already used with a different
	// request (422). The stored response is never returned for it.
	ErrFingerprintMismatch = errors.New("idem: the key was already used with a different request")

	// ErrResponseUnavailable: the operation completed but its response was
	// not stored (too large, or streamed), so it cannot be replayed (409
	// without Retry-After). It never runs again within the record's TTL.
	ErrResponseUnavailable = errors.New("idem: the operation completed but its response was not stored")

	// ErrStoreUnavailable wraps every store failure (503). The operation
	// does not run without a claim.
	ErrStoreUnavailable = errors.New("idem: store unavailable")

	// ErrNoTx is returned by TxFromContext outside an execution on a
	// TxStore.
	ErrNoTx = errors.New("idem: no transaction in context: the store is not transactional or the context is not an idempotent execution")

	// errTxClosed is returned by TxFromContext after the operation
	// returned.
	errTxClosed = errors.New("idem: the operation has returned; its transaction is closed")
)

// Executor runs operations at most once per (scope, key): the engine behind
// the middleware, usable directly by non-HTTP code (message consumers, job
// runners) with the same semantics.
type Executor struct {
	store   Store
	txStore TxStore
	watcher Watcher
	cfg     Config

	// Owner tokens are a random prefix, drawn once per Executor, and a
	// counter: unique across processes and claims, without a call into
	// the system's random source per request. Tokens never leave the
	// server, so they need uniqueness, not secrecy.
	tokenPrefix string
	tokenSeq    atomic.Uint64
}

func (e *Executor) newToken() string {
	var buf [48]byte
	b := append(buf[:0], e.tokenPrefix...)
	return string(strconv.AppendUint(b, e.tokenSeq.Add(1), 36))
}

// NewExecutor returns an Executor on store. A nil cfg means all defaults.
func NewExecutor(store Store, cfg *Config) (*Executor, error) {
	if store == nil {
		return nil, errors.New("idem: nil store")
	}
	rc, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	e := &Executor{store: store, cfg: rc, tokenPrefix: crand.Text() + "-"}
	e.txStore, _ = store.(TxStore)
	e.watcher, _ = store.(Watcher)
	return e, nil
}

// DoParams identify one logical operation.
type DoParams struct {
	// Scope is the record scope; use Scope(tenant, operation).
	Scope string
	// Key is the idempotency key.
	Key string
	// Fingerprint is the request's fingerprint (see Fingerprint).
	Fingerprint string
	// FingerprintAt returns the request's fingerprint in an older encoding
	// version, so that records written before an encoding change still
	// match their retries. Optional.
	FingerprintAt func(version string) (string, bool)
	// Operation names the operation in events and logs. Optional.
	Operation string
	// Payload, if set, is handed to the operation in RequestInfo.Payload:
	// the middleware puts there what Config.FingerprintFunc returned, so
	// that a handler need not validate and normalise its body twice.
	Payload []byte
}

// Result is the outcome of Executor.Do. Do always returns a non-nil Result,
// also with an error, so that callers can report ExpiresAt on 409 and 422.
type Result struct {
	// Response is the operation's response (executed or released) or the
	// stored one (replayed). For ErrResponseUnavailable it holds the
	// original status code only.
	Response *Response
	// Replayed reports that Response was stored by an earlier execution.
	Replayed bool
	// Released reports that the operation ran and its outcome was not
	// stored, so the key can be used again.
	Released bool
	// ExpiresAt is when the record expires (zero if no record was seen).
	ExpiresAt time.Time
	// TookOver reports that the execution took over a record whose previous
	// owner's lease had expired.
	TookOver bool
	// Waited reports that the call waited for an in-flight attempt.
	Waited bool
	// Suspended reports that the operation ended without a stored outcome
	// after saving a recovery point (see Step): the record stays in flight
	// and the next attempt with the key resumes after that point.
	Suspended bool
}

// Operation is the work Executor.Do runs at most once. Its context carries
// the transaction (TxFromContext) on a TxStore and the RequestInfo, and is
// cancelled with cause ErrLeaseLost if the lease is lost.
type Operation func(ctx context.Context) (*Response, error)

// Do runs op at most once for (p.Scope, p.Key) within the record's TTL:
//
//   - new key: op runs; its response is stored or released according to the
//     outcome policy, and returned;
//   - completed with the same fingerprint: the stored response is returned
//     with Replayed set, and op does not run;
//   - in flight: ErrInFlight (after waiting, in wait mode);
//   - another fingerprint: ErrFingerprintMismatch.
//
// If op returns an error or panics, the key is released (and the panic
// resumed); op's error is returned as is. A lost lease yields ErrLeaseLost
// and discards op's result; store failures yield errors wrapping
// ErrStoreUnavailable.
func (e *Executor) Do(ctx context.Context, p DoParams, op Operation) (*Result, error) {
	return e.do(ctx, p, op, e.cfg.NowFunc(), &Result{})
}

func (e *Executor) do(ctx context.Context, p DoParams, op Operation, start time.Time, res *Result) (*Result, error) {
	cp := ClaimParams{
		Scope:       p.Scope,
		Key:         p.Key,
		Fingerprint: p.Fingerprint,
		Token:       e.newToken(),
		Lease:       e.cfg.Lease,
		TTL:         e.cfg.TTL,
	}
	triedVersion := false
	var w *waiter
	defer func() {
		if w != nil {
			w.close()
		}
	}()
	for {
		cp.Now = e.cfg.NowFunc()
		cr, err := e.store.Claim(ctx, cp)
		if err != nil {
			return res, e.storeFailure(ctx, p, start, "claim", err)
		}
		res.ExpiresAt = cr.Record.ExpiresAt
		switch cr.Outcome {
		case ClaimAcquired:
			return e.execute(ctx, p, cp, cr, op, res, start)

		case ClaimCompleted:
			resp := cr.Record.Response
			if resp == nil {
				return res, e.storeFailure(ctx, p, start, "claim", errors.New("completed record without a response"))
			}
			if resp.Unreplayable {
				res.Response = &Response{StatusCode: resp.StatusCode}
				e.emit(ctx, Event{Kind: EventUnavailable, Operation: p.Operation, Status: resp.StatusCode, Waited: res.Waited}, start)
				return res, ErrResponseUnavailable
			}
			res.Response, res.Replayed = resp, true
			e.emit(ctx, Event{Kind: EventReplayed, Operation: p.Operation, Status: resp.StatusCode, Waited: res.Waited}, start)
			return res, nil

		case ClaimMismatch:
			// A record written under an older fingerprint encoding is
			// compared in its own version before calling it a mismatch.
			if v := fingerprintVersionOf(cr.Record.Fingerprint); !triedVersion && p.FingerprintAt != nil &&
				v != fingerprintVersionOf(cp.Fingerprint) {
				triedVersion = true
				if fp, ok := p.FingerprintAt(v); ok && fp == cr.Record.Fingerprint {
					cp.Fingerprint = fp
					continue
				}
			}
			e.emit(ctx, Event{Kind: EventMismatch, Operation: p.Operation, Status: 422, Code: CodeKeyReused, Waited: res.Waited}, start)
			return res, ErrFingerprintMismatch

		case ClaimInFlight:
			if e.cfg.Wait <= 0 {
				e.emit(ctx, Event{Kind: EventInFlight, Operation: p.Operation, Status: 409, Code: CodeRequestInProgress}, start)
				return res, ErrInFlight
			}
			if w == nil {
				w = e.newWaiter()
			}
			res.Waited = true
			if err := w.wait(ctx, p.Scope, p.Key); err != nil {
				if errors.Is(err, ErrInFlight) {
					e.emit(ctx, Event{Kind: EventInFlight, Operation: p.Operation, Status: 409, Code: CodeRequestInProgress, Waited: true}, start)
				}
				return res, err
			}

		default:
			return res, e.storeFailure(ctx, p, start, "claim", fmt.Errorf("unknown claim outcome %d", cr.Outcome))
		}
	}
}

func (e *Executor) storeFailure(ctx context.Context, p DoParams, start time.Time, op string, err error) error {
	err = fmt.Errorf("%w: %s: %w", ErrStoreUnavailable, op, err)
	e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: store failed", slog.String("operation", p.Operation),
		e.cfg.keyAttr(p.Scope, p.Key), slog.Any("error", err))
	e.emit(ctx, Event{Kind: EventStoreError, Operation: p.Operation, Status: 503, Code: CodeStoreUnavailable, Err: err}, start)
	return err
}

func (e *Executor) emit(ctx context.Context, ev Event, start time.Time) {
	if e.cfg.Observer == nil {
		return
	}
	ev.Duration = e.cfg.NowFunc().Sub(start)
	e.cfg.Observer.Observe(ctx, ev)
}

// execute runs op under the claim it owns, renewing the lease, and then
// completes or releases the record.
func (e *Executor) execute(ctx context.Context, p DoParams, cp ClaimParams, cr ClaimResult, op Operation, res *Result, start time.Time) (*Result, error) {
	res.TookOver = cr.TookOver
	if cr.TookOver {
		e.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idem: took over a record whose lease had expired",
			slog.String("operation", p.Operation), e.cfg.keyAttr(p.Scope, p.Key))
	}
	cancelCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The execution's context and its renewer share one allocation.
	x := &execution{}
	ec := &x.ctx
	ec.Context = cancelCtx
	ec.info = RequestInfo{Key: p.Key, Scope: p.Scope, ExpiresAt: cr.Record.ExpiresAt, TookOver: cr.TookOver, Payload: p.Payload, Fence: cr.Record.Fence}
	var opCtx context.Context = ec
	var holder *txHolder
	if e.txStore != nil {
		// The transaction must not die with the client: work that was done
		// is committed even if nobody waits for the answer.
		holder = &txHolder{store: e.txStore, ctx: context.WithoutCancel(opCtx)}
		ec.holder = holder
	}
	x.steps.init(e, cp, holder, cr.Record.Checkpoint)
	ec.steps = &x.steps

	rn := &x.rn
	e.startRenewer(rn, p.Operation, cp, holder, cancel, start)
	resp, opErr, panicked, panicVal := callOperation(opCtx, op)
	// Completion must not depend on the client still being there, and is
	// bounded by StoreTimeout instead.
	storeCtx := rn.finish(ctx)
	defer rn.close()
	var tx StoreTx
	if holder != nil {
		tx = holder.close()
	}
	ids := ReleaseParams{Scope: cp.Scope, Key: cp.Key, Token: cp.Token}

	// When the store said the lease is gone there is nothing to complete.
	// When renewals merely failed until the lease ran out, completion is
	// still attempted: the store's token check decides.
	if rn.takenOver() {
		if tx != nil {
			_ = tx.Rollback(storeCtx)
		}
		return res, e.leaseLost(ctx, p, start, cr.TookOver, ErrLeaseLost, panicked, panicVal)
	}

	release := panicked || opErr != nil || resp == nil || e.cfg.OutcomeFunc(resp.StatusCode) == OutcomeRelease
	if release {
		if tx != nil {
			if err := tx.Rollback(storeCtx); err != nil {
				e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: rollback failed", slog.Any("error", err))
			}
		}
		ids.Now = e.cfg.NowFunc()
		suspended, err := x.steps.end(storeCtx, ids)
		res.Suspended = suspended
		if err != nil {
			if errors.Is(err, ErrLeaseLost) {
				return res, e.leaseLost(ctx, p, start, cr.TookOver, err, panicked, panicVal)
			}
			// The record stays in flight until its lease expires; then
			// a retry takes it over.
			e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: release failed; the key stays blocked until its lease expires",
				slog.String("operation", p.Operation), e.cfg.keyAttr(p.Scope, p.Key), slog.Any("error", err))
			e.emit(ctx, Event{Kind: EventStoreError, Operation: p.Operation, Err: err}, start)
		}
		ev := Event{Kind: EventReleased, Operation: p.Operation, TookOver: cr.TookOver, Err: opErr}
		if suspended {
			ev.Kind = EventSuspended
		}
		if resp != nil {
			ev.Status = resp.StatusCode
		}
		if panicked {
			ev.Err = fmt.Errorf("idem: operation panicked: %v", panicVal)
		}
		e.emit(ctx, ev, start)
		if panicked {
			panic(panicVal)
		}
		if opErr != nil {
			return res, opErr
		}
		res.Response, res.Released = resp, !suspended
		return res, nil
	}

	cpar := CompleteParams{Scope: cp.Scope, Key: cp.Key, Token: cp.Token, Response: resp, Now: e.cfg.NowFunc()}
	var err error
	if tx != nil {
		err = completeWith(storeCtx, tx.Complete, cpar)
		if err == nil {
			err = tx.Commit(storeCtx)
		}
		if err != nil {
			_ = tx.Rollback(storeCtx)
			if errors.Is(err, ErrLeaseLost) {
				return res, e.leaseLost(ctx, p, start, cr.TookOver, err, false, nil)
			}
			// Nothing was committed: free the key for a retry (or, after a
			// recovery point, let the retry resume).
			ids.Now = e.cfg.NowFunc()
			_, _ = x.steps.end(storeCtx, ids)
			return res, e.storeFailure(ctx, p, start, "complete", err)
		}
	} else {
		err = completeWith(storeCtx, e.store.Complete, cpar)
		if errors.Is(err, ErrLeaseLost) {
			return res, e.leaseLost(ctx, p, start, cr.TookOver, err, false, nil)
		}
		if err != nil {
			// The operation ran, so its real response goes to the client,
			// who then has no reason to retry. The record stays in flight
			// until its lease expires.
			e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: storing the response failed; sending it unstored",
				slog.String("operation", p.Operation), e.cfg.keyAttr(p.Scope, p.Key), slog.Any("error", err))
			e.emit(ctx, Event{Kind: EventStoreError, Operation: p.Operation, Status: resp.StatusCode, Err: err}, start)
			res.Response = resp
			return res, nil
		}
	}
	res.Response = resp
	e.emit(ctx, Event{Kind: EventExecuted, Operation: p.Operation, Status: resp.StatusCode, TookOver: cr.TookOver}, start)
	return res, nil
}

// completeWith completes a record and, if the store cannot hold the
// response, completes it as unreplayable instead: too big to store must
// never mean "run it again".
func completeWith(ctx context.Context, complete func(context.Context, CompleteParams) error, p CompleteParams) error {
	err := complete(ctx, p)
	if errors.Is(err, ErrResponseTooLarge) && !p.Response.Unreplayable {
		p.Response = &Response{StatusCode: p.Response.StatusCode, Unreplayable: true}
		err = complete(ctx, p)
	}
	return err
}

func (e *Executor) leaseLost(ctx context.Context, p DoParams, start time.Time, tookOver bool, err error, panicked bool, panicVal any) error {
	e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: lease lost; the result was discarded",
		slog.String("operation", p.Operation), e.cfg.keyAttr(p.Scope, p.Key))
	e.emit(ctx, Event{Kind: EventLeaseLost, Operation: p.Operation, Status: 503, Code: CodeLeaseLost, TookOver: tookOver, Err: err}, start)
	if panicked {
		panic(panicVal)
	}
	return err
}

// callOperation runs op, turning a panic into a value so that the record
// can be released before the panic resumes.
func callOperation(ctx context.Context, op Operation) (resp *Response, err error, panicked bool, panicVal any) {
	defer func() {
		if v := recover(); v != nil {
			panicked, panicVal = true, v
		}
	}()
	resp, err = op(ctx)
	return resp, err, false, nil
}

// renewer keeps the lease alive while the operation runs: every third of a
// lease it renews through the store (or the open transaction, for stores
// that serialise writers). If the store says the lease is lost, or renewals
// keep failing until the lease has run out, it cancels the operation's
// context with cause ErrLeaseLost.
type renewer struct {
	e      *Executor
	op     string
	params RenewParams
	holder *txHolder
	cancel context.CancelCauseFunc
	start  time.Time
	every  time.Duration

	mu          sync.Mutex
	timer       *time.Timer
	stopped     bool
	lostByStore bool
	leaseEnd    time.Time
	inflight    context.CancelFunc
	storeCancel func()
	storeCtx    detachedContext
}

// execution holds what one execution needs for as long as it runs.
type execution struct {
	ctx   execContext
	rn    renewer
	steps stepRun
}

func (e *Executor) startRenewer(r *renewer, op string, cp ClaimParams, holder *txHolder, cancel context.CancelCauseFunc, start time.Time) {
	r.e, r.op, r.holder, r.cancel, r.start = e, op, holder, cancel, start
	r.params = RenewParams{Scope: cp.Scope, Key: cp.Key, Token: cp.Token, Lease: cp.Lease}
	r.every = cp.Lease / 3
	r.leaseEnd = cp.Now.Add(cp.Lease)
	r.mu.Lock()
	r.timer = time.AfterFunc(r.every, r.fire)
	r.mu.Unlock()
}

func (r *renewer) fire() {
	r.mu.Lock()
	if r.stopped {
		// After finish the timer bounds the completion's store calls.
		if r.storeCancel != nil {
			r.storeCancel()
		}
		r.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.e.cfg.StoreTimeout)
	r.inflight = cancel
	r.mu.Unlock()
	defer cancel()

	p := r.params
	p.Now = r.e.cfg.NowFunc()
	var err error
	if tr := r.holder.renewer(); tr != nil {
		err = tr.Renew(ctx, p)
	} else {
		err = r.e.store.Renew(ctx, p)
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopped {
		return
	}
	switch {
	case err == nil:
		r.leaseEnd = p.Now.Add(p.Lease)
		r.e.emit(ctx, Event{Kind: EventRenewed, Operation: r.op}, r.start)
	case errors.Is(err, ErrLeaseLost):
		r.lostByStore = true
		r.cancel(ErrLeaseLost)
		return
	case !r.e.cfg.NowFunc().Before(r.leaseEnd):
		// The lease ran out while the store could not be reached: another
		// attempt may own the record now, so the operation must stop.
		r.e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: lease expired while renewals failed; cancelling the operation",
			slog.String("operation", r.op), r.e.cfg.keyAttr(r.params.Scope, r.params.Key), slog.Any("error", err))
		r.e.emit(ctx, Event{Kind: EventStoreError, Operation: r.op, Err: err}, r.start)
		r.cancel(ErrLeaseLost)
		return
	default:
		r.e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: lease renewal failed; retrying",
			slog.String("operation", r.op), r.e.cfg.keyAttr(r.params.Scope, r.params.Key), slog.Any("error", err))
		r.e.emit(ctx, Event{Kind: EventStoreError, Operation: r.op, Err: err}, r.start)
	}
	r.timer.Reset(r.every)
}

// finish ends renewal without waiting for a renewal in progress (which may
// be queued behind the operation's own transaction; its result is
// ignored), and returns the context for the completion's store calls: not
// cancelled with the request, and cancelled after StoreTimeout by the same
// timer that drove the renewals, which saves a timer per request.
func (r *renewer) finish(ctx context.Context) context.Context {
	r.storeCtx.parent = ctx
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	if r.inflight != nil {
		r.inflight()
	}
	r.storeCancel = r.storeCtx.expire
	r.timer.Reset(r.e.cfg.StoreTimeout)
	return &r.storeCtx
}

// close releases the timer and the completion's context.
func (r *renewer) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timer.Stop()
	r.storeCtx.expire()
}

// detachedContext carries a request's values but not its cancellation; it
// ends when expire is called (by the renewer's timer after StoreTimeout, or
// when the execution is over). It lives inside the execution's allocation.
type detachedContext struct {
	parent context.Context
	mu     sync.Mutex
	done   chan struct{}
	err    error
	funcs  []*func()
}

func (c *detachedContext) Deadline() (time.Time, bool) { return time.Time{}, false }

func (c *detachedContext) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		c.done = make(chan struct{})
		if c.err != nil {
			close(c.done)
		}
	}
	return c.done
}

func (c *detachedContext) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *detachedContext) Value(key any) any { return c.parent.Value(key) }

func (c *detachedContext) expire() {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = context.DeadlineExceeded
	if c.done != nil {
		close(c.done)
	}
	funcs := c.funcs
	c.funcs = nil
	c.mu.Unlock()
	for _, f := range funcs {
		if f != nil {
			go (*f)()
		}
	}
}

// AfterFunc lets contexts derived from this one (context.WithCancel,
// context.AfterFunc, as database drivers use) register for its end without
// a watching goroutine each.
func (c *detachedContext) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		go f()
		return func() bool { return false }
	}
	fp := &f
	c.funcs = append(c.funcs, fp)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, g := range c.funcs {
			if g == fp {
				c.funcs[i] = nil
				return true
			}
		}
		return false
	}
}

// takenOver reports that the store refused a renewal because the token no
// longer owns the record.
func (r *renewer) takenOver() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lostByStore
}

// txHolder begins the operation's transaction on first use and hands it to
// the executor when the operation returns.
type txHolder struct {
	store TxStore
	ctx   context.Context

	mu     sync.Mutex
	tx     StoreTx
	err    error
	closed bool
}

func (h *txHolder) get() (StoreTx, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errTxClosed
	}
	if h.tx == nil && h.err == nil {
		h.tx, h.err = h.store.BeginTx(h.ctx)
		if h.err != nil {
			h.err = fmt.Errorf("%w: begin: %w", ErrStoreUnavailable, h.err)
		}
	}
	return h.tx, h.err
}

func (h *txHolder) close() StoreTx {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	return h.tx
}

func (h *txHolder) renewer() TxRenewer {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.tx != nil {
		tr, _ := h.tx.(TxRenewer)
		return tr
	}
	return nil
}

// TxFromContext returns the transaction of the idempotent execution ctx
// belongs to, beginning it on first use. Business writes made through it
// commit together with the stored response, after the operation returns and
// before the response is sent; if the operation fails, panics, or loses its
// lease, they roll back. Store packages offer typed forms
// (sqlitestore.Tx, pgstore.Tx). Outside such an execution it returns
// ErrNoTx.
func TxFromContext(ctx context.Context) (StoreTx, error) {
	h, ok := ctx.Value(txHolderKey).(*txHolder)
	if !ok {
		return nil, ErrNoTx
	}
	return h.get()
}

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

func (w *waiter) close() {
	w.deadline.Stop()
	if w.timer != nil {
		w.timer.Stop()
	}
}

func (w *waiter) wait(ctx context.Context, scope, key string) error {
	var changed <-chan struct{}
	wctx, cancel := context.WithCancel(ctx)
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
		return ErrInFlight
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	return nil
}

// execContext is the context of one execution: cancellable with a cause
// (lease loss) and carrying the RequestInfo and the transaction holder,
// in one allocation instead of a chain of context.WithValue.
type execContext struct {
	context.Context
	info   RequestInfo
	holder *txHolder
	steps  *stepRun
}

func (c *execContext) Value(key any) any {
	switch key {
	case infoKey:
		return &c.info
	case txHolderKey:
		if c.holder != nil {
			return c.holder
		}
		return nil
	case stepsKey:
		return c.steps
	}
	return c.Context.Value(key)
}
