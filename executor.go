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

	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
)

// Errors returned by Executor.Do. The middleware maps each to its HTTP
// answer.
var (
	// ErrInFlight: another attempt with the same key is running (409).
	ErrInFlight = idemstore.ErrInFlight

	// ErrLeaseLost: the operation's lease was lost (another attempt took
	// the record over after it expired), so its result was discarded (503).
	ErrLeaseLost = idemstore.ErrLeaseLost

	// ErrRecordUnreadable: a record exists but what it holds cannot be
	// decrypted (Config.Encryption; see ErrRecordUnreadable):
	// 503 idempotency.record_unreadable, and the operation does not run.
	ErrRecordUnreadable = idemcrypt.ErrRecordUnreadable

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
	store   idemstore.Store
	txStore idemstore.TxStore
	// claimer is the store's TxClaimer when Config.ClaimInTx is set.
	claimer idemstore.TxClaimer
	watcher idemstore.Watcher
	phases  PhaseObserver // Config.Observer, if it traces phases
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
// It refuses a Config that sets a field marked "Middleware only".
func NewExecutor(store idemstore.Store, cfg *Config) (*Executor, error) {
	if name := cfg.middlewareOnlySet(); name != "" {
		return nil, fmt.Errorf("idem: NewExecutor: Config.%s applies to the Middleware only, which reads it from each HTTP request; the Executor would ignore it (leave it unset, or use NewMiddleware)", name)
	}
	return newExecutor(store, cfg)
}

// newExecutor is NewExecutor for the Middleware, which uses every field.
func newExecutor(store idemstore.Store, cfg *Config) (*Executor, error) {
	if store == nil {
		return nil, errors.New("idem: nil store")
	}
	rc, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	e := &Executor{store: store, cfg: rc, tokenPrefix: crand.Text() + "-"}
	e.txStore, _ = store.(idemstore.TxStore)
	if rc.ClaimInTx {
		if e.claimer, _ = store.(idemstore.TxClaimer); e.claimer == nil {
			return nil, fmt.Errorf("idem: Config.ClaimInTx needs a store that implements TxClaimer (sqlitestore, pgstore), not %T", store)
		}
	}
	e.phases, _ = rc.Observer.(PhaseObserver)
	e.watcher, _ = store.(idemstore.Watcher)
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

	// hold is set by Reconcile: when its attempt holds the record for an
	// operator (steps.go).
	hold *holdPolicy
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
	// Held reports, with Suspended, that the record is held for an
	// operator (see ReconcileParams.MaxAttempts): Reconcile no longer
	// resumes it, though a retry with the key still does.
	Held bool
}

// Response is an operation's response: what Executor.Do stores and
// replays. The middleware fills it from what the handler wrote.
type Response = idemstore.Response

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
// If op returns an error, the key is released and op's error is returned as
// is. If op panics, the key is released and the panic continues, with op's
// own stack. A lost lease yields ErrLeaseLost and discards op's result;
// store failures (including a store call that outlives Config.StoreTimeout)
// yield errors wrapping ErrStoreUnavailable. With Config.Encryption, a
// completed record whose response cannot be decrypted yields
// ErrRecordUnreadable, and op does not run.
func (e *Executor) Do(ctx context.Context, p DoParams, op Operation) (*Result, error) {
	return e.do(ctx, p, op, e.cfg.NowFunc(), &Result{})
}

// do is Do with the time the request reached idem, which events measure
// from, and the Result to fill (the middleware's lives in its per-request
// state).
func (e *Executor) do(ctx context.Context, p DoParams, op Operation, start time.Time, res *Result) (*Result, error) {
	// With idemcrypt.Config.HashKey the stores see digests, never the
	// client's values; p keeps them for the operation and the logs.
	storedScope, storedKey := e.cfg.Encryption.StoredKey(p.Scope, p.Key)
	cp := idemstore.ClaimParams{
		Scope:       storedScope,
		Key:         storedKey,
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
		var (
			cr  idemstore.ClaimResult
			err error
			tx  *txHolder
		)
		if e.claimer != nil {
			cr, tx, err = e.claimTx(ctx, &p, cp)
		} else {
			cr, err = e.claim(ctx, &p, cp)
		}
		if err != nil {
			return res, e.storeFailure(ctx, p, start, "claim", err)
		}
		res.ExpiresAt = cr.Record.ExpiresAt
		switch cr.Outcome {
		case idemstore.ClaimAcquired:
			return e.execute(ctx, p, cp, cr, tx, op, res, start)

		case idemstore.ClaimCompleted:
			return res, e.replay(ctx, p, cr.Record.Response, res, start)

		case idemstore.ClaimMismatch:
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

		case idemstore.ClaimInFlight:
			if e.cfg.Wait <= 0 {
				e.emit(ctx, Event{Kind: EventInFlight, Operation: p.Operation, Status: 409, Code: CodeRequestInProgress}, start)
				return res, idemstore.ErrInFlight
			}
			if w == nil {
				w = e.newWaiter()
			}
			res.Waited = true
			if err := w.wait(ctx, cp.Scope, cp.Key); err != nil {
				if errors.Is(err, idemstore.ErrInFlight) {
					e.emit(ctx, Event{Kind: EventInFlight, Operation: p.Operation, Status: 409, Code: CodeRequestInProgress, Waited: true}, start)
				}
				return res, err
			}

		default:
			return res, e.storeFailure(ctx, p, start, "claim", fmt.Errorf("unknown claim outcome %d", cr.Outcome))
		}
	}
}

// replay returns the stored response of a completed record in res.
func (e *Executor) replay(ctx context.Context, p DoParams, resp *Response, res *Result, start time.Time) error {
	if resp == nil {
		return e.storeFailure(ctx, p, start, "claim", errors.New("completed record without a response"))
	}
	resp, err := e.cfg.Encryption.Open(ctx, p.Scope, p.Key, resp)
	if err != nil {
		return e.unreadable(ctx, p, start, "response", err)
	}
	if resp.Unreplayable {
		res.Response = &Response{StatusCode: resp.StatusCode}
		e.emit(ctx, Event{Kind: EventUnavailable, Operation: p.Operation, Status: resp.StatusCode, Waited: res.Waited}, start)
		return ErrResponseUnavailable
	}
	_, end := e.phase(ctx, PhaseReplay, &p)
	res.Response, res.Replayed = resp, true
	end(nil)
	e.emit(ctx, Event{Kind: EventReplayed, Operation: p.Operation, Status: resp.StatusCode, Waited: res.Waited}, start)
	return nil
}

// claim calls Store.Claim within StoreTimeout: a store that stops answering
// must not hold the request for as long as the client waits.
func (e *Executor) claim(ctx context.Context, p *DoParams, cp idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	ctx, end := e.phase(ctx, PhaseClaim, p)
	ctx, cancel := context.WithTimeout(ctx, e.cfg.StoreTimeout)
	defer cancel()
	cr, err := e.store.Claim(ctx, cp)
	end(err)
	return cr, err
}

// claimTx calls TxClaimer.ClaimTx within StoreTimeout. On ClaimAcquired
// with a transaction, it returns the transaction in a holder for the
// execution; the transaction's context is not the request's (work that
// was done is recorded even if the client has gone), and it is cancelled
// only if ClaimTx outlives StoreTimeout, or once the transaction ended.
func (e *Executor) claimTx(ctx context.Context, p *DoParams, cp idemstore.ClaimParams) (idemstore.ClaimResult, *txHolder, error) {
	pctx, end := e.phase(ctx, PhaseClaim, p)
	h := &txHolder{store: e.claimer, ctx: context.WithoutCancel(pctx), timeout: e.cfg.StoreTimeout}
	var (
		cr idemstore.ClaimResult
		tx idemstore.Tx
	)
	err := h.run(func(ctx context.Context) (err error) {
		cr, tx, err = e.claimer.ClaimTx(ctx, cp)
		return err
	}, func() idemstore.Tx { t := tx; tx = nil; return t }) // run rolls back what it takes
	end(err)
	if tx == nil {
		h.end()
		return cr, nil, err
	}
	if err == nil && (cr.Outcome != idemstore.ClaimAcquired || cr.TookOver) {
		err = fmt.Errorf("ClaimTx answered %v (took over: %v) with an open transaction", cr.Outcome, cr.TookOver)
	}
	if err != nil {
		e.rollback(h.ctx, tx)
		h.end()
		return cr, nil, err
	}
	h.tx, h.claimed = tx, true
	return cr, h, nil
}

func (e *Executor) storeFailure(ctx context.Context, p DoParams, start time.Time, op string, err error) error {
	err = fmt.Errorf("%w: %s: %w", ErrStoreUnavailable, op, err)
	e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: store failed", slog.String("operation", p.Operation),
		keyAttr(p.Key), slog.Any("error", err))
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

// execution is one run of an operation under a claim it owns.
type execution struct {
	p        DoParams
	ids      idemstore.ReleaseParams // the record and its owner token
	start    time.Time
	tookOver bool
	info     RequestInfo // what InfoFromContext returns
	tx       *txHolder   // nil unless the store is a TxStore
	rn       renewer
	steps    stepRun // the recovery points of a multi-step operation (steps.go)
}

// claimed reports that the claim is uncommitted, in the transaction of
// x.tx (Config.ClaimInTx): ending the transaction ends the record.
func (x *execution) claimed() bool { return x.tx != nil && x.tx.claimed }

// execKey is the context key of the *execution an operation runs in.
type execKey struct{}

// errPanicked is the outcome recorded for an operation that panicked.
var errPanicked = errors.New("idem: the operation panicked")

// execute runs op under the claim it owns, renewing the lease meanwhile,
// and then records the outcome.
//
// claimed, if not nil, holds the transaction ClaimTx wrote the claim in:
// the operation runs in it, and no lease renewal runs, since nobody can take
// an uncommitted claim over.
func (e *Executor) execute(ctx context.Context, p DoParams, cp idemstore.ClaimParams, cr idemstore.ClaimResult, claimed *txHolder, op Operation, res *Result, start time.Time) (*Result, error) {
	res.TookOver = cr.TookOver
	if cr.TookOver {
		e.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idem: took over a record whose lease had expired",
			slog.String("operation", p.Operation), keyAttr(p.Key))
	}
	checkpoint, err := e.openCheckpoint(ctx, p, cp, cr.Record.Checkpoint, start)
	if err != nil {
		return res, err
	}
	// Store calls made for the execution (renewals, the transaction, the
	// outcome) keep the request's values but not its cancellation: work
	// that was done is recorded even if the client has gone. Each call is
	// bounded by StoreTimeout instead.
	detached := context.WithoutCancel(ctx)
	x := &execution{
		p:        p,
		ids:      idemstore.ReleaseParams{Scope: cp.Scope, Key: cp.Key, Token: cp.Token},
		start:    start,
		tookOver: cr.TookOver,
		info: RequestInfo{Key: p.Key, Scope: p.Scope, ExpiresAt: cr.Record.ExpiresAt, TookOver: cr.TookOver, Payload: p.Payload,
			Fence: cr.Record.Fence},
	}
	switch {
	case claimed != nil:
		x.tx = claimed
	case e.txStore != nil:
		x.tx = &txHolder{store: e.txStore, ctx: detached, timeout: e.cfg.StoreTimeout}
	}
	x.steps.init(e, p, cp, x.tx, checkpoint)
	opCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if !x.claimed() {
		e.startRenewer(&x.rn, detached, x, cp, cancel)
	}

	// If op panics, the deferred function records the outcome (the key is
	// released) and the panic then continues from op's own frame.
	returned := false
	opCtx, end := e.phase(opCtx, PhaseExecute, &x.p)
	defer func() {
		if !returned {
			end(errPanicked)
			e.record(detached, x, nil, errPanicked)
		}
	}()
	resp, opErr := op(context.WithValue(opCtx, execKey{}, x))
	returned = true
	end(opErr)
	released, err := e.record(detached, x, resp, opErr)
	res.Suspended, res.Held = x.steps.suspended, x.steps.held
	if err != nil {
		return res, err
	}
	res.Response, res.Released = resp, released && !res.Suspended
	return res, nil
}

// record ends an execution: it stops the renewals and completes the record
// with resp, or releases it (when op failed, panicked or the outcome policy
// says so), and reports whether it released it. It returns opErr, or an
// error of its own when the outcome could not be recorded in a way the
// caller must know about (lost lease, failed transactional commit). ctx is
// not cancelled with the request.
func (e *Executor) record(ctx context.Context, x *execution, resp *Response, opErr error) (bool, error) {
	x.rn.stop()
	tx := x.tx.close()
	defer x.tx.end()

	// When the store said the lease is gone there is nothing to record.
	// When renewals merely failed until the lease ran out, recording is
	// still attempted: the store's token check decides.
	if x.rn.lostByStore() {
		if tx != nil {
			e.rollback(ctx, tx)
		}
		return false, e.leaseLost(ctx, x, idemstore.ErrLeaseLost)
	}
	if opErr != nil || resp == nil || e.cfg.OutcomeFunc(resp.StatusCode) == OutcomeRelease {
		// After a recovery point the record is kept for the next attempt
		// instead (steps.go).
		if err := e.releaseOrSuspend(ctx, x, tx); errors.Is(err, idemstore.ErrLeaseLost) {
			return false, e.leaseLost(ctx, x, err)
		}
		ev := Event{Kind: EventReleased, Operation: x.p.Operation, TookOver: x.tookOver, Err: opErr}
		switch {
		case x.steps.held:
			ev.Kind = EventHeld
		case x.steps.suspended:
			ev.Kind = EventSuspended
		}
		if resp != nil {
			ev.Status = resp.StatusCode
		}
		e.emit(ctx, ev, x.start)
		return true, opErr
	}

	cp := idemstore.CompleteParams{Scope: x.ids.Scope, Key: x.ids.Key, Token: x.ids.Token, Response: resp, Now: e.cfg.NowFunc()}
	if tx != nil {
		pctx, end := e.phase(ctx, PhaseComplete, &x.p)
		err := e.completeTx(pctx, tx, cp, x.p)
		end(err)
		if errors.Is(err, idemstore.ErrLeaseLost) {
			e.rollback(ctx, tx)
			return false, e.leaseLost(ctx, x, err)
		}
		if err != nil {
			// Nothing was committed: free the key for a retry (or keep it
			// at its recovery point).
			_ = e.releaseOrSuspend(ctx, x, tx)
			return false, e.storeFailure(ctx, x.p, x.start, "complete", err)
		}
	} else {
		pctx, end := e.phase(ctx, PhaseComplete, &x.p)
		sctx, cancel := context.WithTimeout(pctx, e.cfg.StoreTimeout)
		err := e.completeWith(sctx, e.store.Complete, cp, x.p)
		cancel()
		end(err)
		if errors.Is(err, idemstore.ErrLeaseLost) {
			return false, e.leaseLost(ctx, x, err)
		}
		if err != nil {
			// The operation ran, so its real response goes to the client,
			// who then has no reason to retry. The record stays in flight
			// until its lease expires.
			e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: storing the response failed; sending it unstored",
				slog.String("operation", x.p.Operation), keyAttr(x.p.Key), slog.Any("error", err))
			e.emit(ctx, Event{Kind: EventStoreError, Operation: x.p.Operation, Status: resp.StatusCode, Err: err}, x.start)
			return false, nil
		}
	}
	e.emit(ctx, Event{Kind: EventExecuted, Operation: x.p.Operation, Status: resp.StatusCode, TookOver: x.tookOver}, x.start)
	return false, nil
}

// completeTx completes the record inside the operation's transaction and
// commits both, each call within StoreTimeout.
func (e *Executor) completeTx(ctx context.Context, tx idemstore.Tx, p idemstore.CompleteParams, dp DoParams) error {
	sctx, cancel := context.WithTimeout(ctx, e.cfg.StoreTimeout)
	err := e.completeWith(sctx, tx.Complete, p, dp)
	cancel()
	if err != nil {
		return err
	}
	sctx, cancel = context.WithTimeout(ctx, e.cfg.StoreTimeout)
	defer cancel()
	return tx.Commit(sctx)
}

// release rolls back the operation's transaction, if any, and deletes the
// record so that the key can be used again. A failure other than
// ErrLeaseLost is logged and reported: the record then stays in flight until
// its lease expires, when a retry takes it over.
func (e *Executor) release(ctx context.Context, x *execution, tx idemstore.Tx) error {
	if tx != nil {
		e.rollback(ctx, tx)
	}
	if x.claimed() {
		// The claim was in the transaction: nothing of it remains.
		return nil
	}
	pctx, end := e.phase(ctx, PhaseRelease, &x.p)
	sctx, cancel := context.WithTimeout(pctx, e.cfg.StoreTimeout)
	defer cancel()
	p := x.ids
	p.Now = e.cfg.NowFunc()
	err := e.store.Release(sctx, p)
	end(err)
	if err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
		e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: release failed; the key stays blocked until its lease expires",
			slog.String("operation", x.p.Operation), keyAttr(x.p.Key), slog.Any("error", err))
		e.emit(ctx, Event{Kind: EventStoreError, Operation: x.p.Operation, Err: err}, x.start)
	}
	return err
}

func (e *Executor) rollback(ctx context.Context, tx idemstore.Tx) {
	sctx, cancel := context.WithTimeout(ctx, e.cfg.StoreTimeout)
	defer cancel()
	if err := tx.Rollback(sctx); err != nil {
		e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: rollback failed", slog.Any("error", err))
	}
}

// completeWith completes a record and, if the store cannot hold the
// response, completes it as unreplayable instead: too big to store must
// never mean "run it again".
//
// With Config.Encryption the store receives the sealed response, bound to
// the record's (scope, key) as the client named them (dp).
func (e *Executor) completeWith(ctx context.Context, complete func(context.Context, idemstore.CompleteParams) error, p idemstore.CompleteParams, dp DoParams) error {
	resp := p.Response
	var err error
	if p.Response, err = e.cfg.Encryption.Seal(ctx, dp.Scope, dp.Key, resp); err != nil {
		return err
	}
	err = complete(ctx, p)
	if errors.Is(err, idemstore.ErrResponseTooLarge) && !resp.Unreplayable {
		if p.Response, err = e.cfg.Encryption.Seal(ctx, dp.Scope, dp.Key, &Response{StatusCode: resp.StatusCode, Unreplayable: true}); err != nil {
			return err
		}
		err = complete(ctx, p)
	}
	return err
}

func (e *Executor) leaseLost(ctx context.Context, x *execution, err error) error {
	e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: lease lost; the result was discarded",
		slog.String("operation", x.p.Operation), keyAttr(x.p.Key))
	e.emit(ctx, Event{Kind: EventLeaseLost, Operation: x.p.Operation, Status: 503, Code: CodeLeaseLost, TookOver: x.tookOver, Err: err}, x.start)
	return err
}

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

func (e *Executor) startRenewer(r *renewer, ctx context.Context, x *execution, cp idemstore.ClaimParams, cancel context.CancelCauseFunc) {
	r.e, r.ctx, r.x, r.cancel = e, ctx, x, cancel
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

// txHolder begins the operation's transaction on first use and hands it to
// the executor when the operation returns. A nil *txHolder (a store without
// transactions) holds nothing.
type txHolder struct {
	store   idemstore.TxStore
	ctx     context.Context
	timeout time.Duration

	mu     sync.Mutex
	tx     idemstore.Tx
	err    error
	closed bool
	cancel context.CancelCauseFunc // ends the context the transaction began with
	// claimed reports that tx holds the execution's uncommitted claim
	// (ClaimTx): it cannot be replaced by a new transaction.
	claimed bool
}

func (h *txHolder) get() (idemstore.Tx, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, errTxClosed
	}
	if h.tx == nil && h.err == nil {
		h.tx, h.err = h.begin()
	}
	return h.tx, h.err
}

// begin calls BeginTx within the store timeout.
func (h *txHolder) begin() (idemstore.Tx, error) {
	var tx idemstore.Tx
	err := h.run(func(ctx context.Context) (err error) {
		tx, err = h.store.BeginTx(ctx)
		return err
	}, func() idemstore.Tx { return tx })
	if err != nil {
		return nil, fmt.Errorf("%w: begin: %w", ErrStoreUnavailable, err)
	}
	return tx, nil
}

// run calls start (BeginTx or ClaimTx) within the store timeout, and keeps
// the context the transaction began with, which must outlive the call
// (database/sql rolls a transaction back when its context ends): it is not
// a context with a deadline, but one that a timer cancels only if start
// has not returned in time, and that end cancels after the transaction is
// over. started returns the transaction start opened, if any.
func (h *txHolder) run(start func(context.Context) error, started func() idemstore.Tx) error {
	ctx, cancel := context.WithCancelCause(h.ctx)
	timer := time.AfterFunc(h.timeout, func() { cancel(context.DeadlineExceeded) })
	err := start(ctx)
	if !timer.Stop() && err == nil {
		if tx := started(); tx != nil {
			// The timeout fired as start returned: the transaction it
			// opened is already ending.
			rctx, rcancel := context.WithTimeout(h.ctx, h.timeout)
			_ = tx.Rollback(rctx)
			rcancel()
			err = context.DeadlineExceeded
		}
	}
	if err != nil {
		cancel(nil)
		return err
	}
	h.cancel = cancel
	return nil
}

// close returns the transaction, if one was begun, and refuses to begin
// one afterwards.
func (h *txHolder) close() idemstore.Tx {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	return h.tx
}

// end releases the transaction's context once it was committed or rolled
// back.
func (h *txHolder) end() {
	if h != nil && h.cancel != nil {
		h.cancel(nil)
	}
}

func (h *txHolder) renewer() idemstore.TxRenewer {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	tr, _ := h.tx.(idemstore.TxRenewer)
	return tr
}

// TxFromContext returns the transaction of the idempotent execution ctx
// belongs to, beginning it on first use. Business writes made through it
// commit together with the stored response, after the operation returns and
// before the response is sent; if the operation fails, panics, or loses its
// lease, they roll back. Store packages offer typed forms
// (sqlitestore.Tx, pgstore.Tx). Outside such an execution it returns
// ErrNoTx; if the store does not answer within Config.StoreTimeout, an
// error wrapping ErrStoreUnavailable.
func TxFromContext(ctx context.Context) (idemstore.Tx, error) {
	x, ok := ctx.Value(execKey{}).(*execution)
	if !ok || x.tx == nil {
		return nil, ErrNoTx
	}
	return x.tx.get()
}

// InfoFromContext returns the RequestInfo of the idempotent execution that
// ctx belongs to, and false outside one. Handlers use it to pass the key on
// to their own providers.
func InfoFromContext(ctx context.Context) (*RequestInfo, bool) {
	x, ok := ctx.Value(execKey{}).(*execution)
	if !ok {
		return nil, false
	}
	return &x.info, true
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
