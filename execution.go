package idem

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idemhq/idem/idemstore"
)

// execution is one run of an operation under a claim it owns; the
// operation's context carries it (InfoFromContext, TxFromContext, Step).
//
// It is allocated per execution, so its parts hold nothing twice: the
// renewer and the steps read the record's names and the executor here.
// That keeps it within 632 bytes, which
// with the 8-byte header the runtime adds to an object with pointers over
// 512 bytes is the 640-byte size class, below the 896 it took before: 256
// bytes less allocated per first execution, which the collector's pacing
// turns into fewer cycles.
type execution struct {
	e     *Executor
	p     DoParams
	ids   recordIDs // the record as stores name it, and its owner token
	start time.Time
	// tookOver is cr.TookOver; info's copy is the handler's to change.
	tookOver bool
	info     RequestInfo // what InfoFromContext returns
	tx       *txHolder   // nil unless the store is a TxStore
	rn       renewer
	steps    stepRun // the recovery points of a multi-step operation (steps.go)
	ctx      execContext
}

// recordIDs names the record an execution owns (with
// idemcrypt.Config.HashKey, the digests of its scope and key) and its
// owner token.
type recordIDs struct{ scope, key, token string }

// execContext is the operation's context: the context it wraps, with the
// execution as the value of execKey. It is what context.WithValue would
// make, held in the execution's allocation: one allocation less per
// execution (docs/BENCHMARKS.md). Like WithValue's, it delegates
// everything else, so that the context package still sees the cancellation
// of the context it wraps (no goroutine propagates a child's).
type execContext struct {
	context.Context
	x *execution
}

func (c *execContext) Value(key any) any {
	if key == (execKey{}) {
		return c.x
	}
	return c.Context.Value(key)
}

// claimed reports that the claim is uncommitted, in the transaction of
// x.tx (Config.ClaimInTx): ending the transaction ends the record.
func (x *execution) claimed() bool { return x.tx != nil && x.tx.claimed }

// execKey is the context key of the *execution an operation runs in.
type execKey struct{}

// errPanicked is the outcome recorded for an operation that panicked.
var errPanicked = errors.New("idem: the operation panicked")

// execute runs the operation under the claim it owns, renewing the lease
// meanwhile, and then records the outcome.
//
// claimed, if not nil, holds the transaction ClaimTx wrote the claim in:
// the operation runs in it, and no lease renewal runs, since nobody can take
// an uncommitted claim over.
func (c *call) execute(cr idemstore.ClaimResult, claimed *txHolder) (*Result, error) {
	e, ctx, p, res := c.e, c.ctx, c.p, c.res
	res.TookOver = cr.TookOver
	if cr.TookOver {
		e.cfg.Logger.LogAttrs(ctx, slog.LevelInfo, "idem: took over a record whose lease had expired",
			slog.String("operation", p.Operation), keyAttr(p.Key))
	}
	checkpoint, err := e.openCheckpoint(ctx, p, c.cp, cr.Record.Checkpoint, c.start)
	if err != nil {
		return res, err
	}
	// Store calls made for the execution (renewals, the transaction, the
	// outcome) keep the request's values but not its cancellation: work
	// that was done is recorded even if the client has gone. Each call is
	// bounded by StoreTimeout instead.
	detached := context.WithoutCancel(ctx)
	x := &execution{
		e:        e,
		p:        p,
		ids:      recordIDs{c.cp.Scope, c.cp.Key, c.cp.Token},
		start:    c.start,
		tookOver: cr.TookOver,
		info: RequestInfo{Key: p.Key, Scope: p.Scope, ExpiresAt: cr.Record.ExpiresAt, TookOver: cr.TookOver, Payload: p.Payload,
			Fence: cr.Record.Fence},
	}
	c.x = x
	switch {
	case claimed != nil:
		x.tx = claimed
	case e.txStore != nil:
		x.tx = &txHolder{store: e.txStore, ctx: detached, timeout: e.cfg.StoreTimeout}
	}
	x.steps.init(x, c.cp, checkpoint)
	opCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if !x.claimed() {
		x.rn.start(detached, x, c.cp, cancel)
	}

	// If the operation panics, the deferred function records the outcome
	// (the key is released) and the panic then continues from the
	// operation's own frame.
	returned := false
	opCtx, end := e.phase(opCtx, PhaseExecute, &x.p)
	defer func() {
		if !returned {
			end(errPanicked)
			x.record(detached, nil, errPanicked)
		}
	}()
	x.ctx = execContext{Context: opCtx, x: x}
	resp, opErr := c.op.run(&x.ctx)
	returned = true
	end(opErr)
	released, err := x.record(detached, resp, opErr)
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
func (x *execution) record(ctx context.Context, resp *Response, opErr error) (bool, error) {
	e := x.e
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
		return false, x.leaseLost(ctx, idemstore.ErrLeaseLost)
	}
	if opErr != nil || resp == nil || e.cfg.OutcomeFunc(resp.StatusCode) == OutcomeRelease {
		// After a recovery point the record is kept for the next attempt
		// instead (steps.go).
		if err := x.releaseOrSuspend(ctx, tx); errors.Is(err, idemstore.ErrLeaseLost) {
			return false, x.leaseLost(ctx, err)
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

	cp := idemstore.CompleteParams{Scope: x.ids.scope, Key: x.ids.key, Token: x.ids.token, Response: resp, Now: e.cfg.NowFunc()}
	if tx != nil {
		pctx, end := e.phase(ctx, PhaseComplete, &x.p)
		err := e.completeTx(pctx, tx, cp, x.p)
		end(err)
		if errors.Is(err, idemstore.ErrLeaseLost) {
			e.rollback(ctx, tx)
			return false, x.leaseLost(ctx, err)
		}
		if err != nil {
			// Nothing was committed: free the key for a retry (or keep it
			// at its recovery point).
			_ = x.releaseOrSuspend(ctx, tx)
			return false, e.storeFailure(ctx, x.p, x.start, "complete", err)
		}
	} else {
		pctx, end := e.phase(ctx, PhaseComplete, &x.p)
		sctx, cancel := e.storeCall(pctx)
		err := e.completeWith(sctx, e.store.Complete, cp, x.p)
		cancel()
		end(err)
		if errors.Is(err, idemstore.ErrLeaseLost) {
			return false, x.leaseLost(ctx, err)
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
func (x *execution) release(ctx context.Context, tx idemstore.Tx) error {
	e := x.e
	if tx != nil {
		e.rollback(ctx, tx)
	}
	if x.claimed() {
		// The claim was in the transaction: nothing of it remains.
		return nil
	}
	pctx, end := e.phase(ctx, PhaseRelease, &x.p)
	sctx, cancel := e.storeCall(pctx)
	defer cancel()
	p := idemstore.ReleaseParams{Scope: x.ids.scope, Key: x.ids.key, Token: x.ids.token, Now: e.cfg.NowFunc()}
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

func (x *execution) leaseLost(ctx context.Context, err error) error {
	e := x.e
	e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: lease lost; the result was discarded",
		slog.String("operation", x.p.Operation), keyAttr(x.p.Key))
	e.emit(ctx, Event{Kind: EventLeaseLost, Operation: x.p.Operation, Status: 503, Code: CodeLeaseLost, TookOver: x.tookOver, Err: err}, x.start)
	return err
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
