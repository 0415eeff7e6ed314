package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemhq/idem/idemstore"
)

// call is the state of one Executor.Do: what it claims, what it has learned
// on the way, and the Result it fills. The steps of the claim loop are its
// methods. A call lives on its caller's stack; only the Result (which the
// caller keeps, in the middleware's per-request state) is allocated. Once
// the call owns the claim, the execution (execution.go) holds the state of
// the run, allocated only then. Replays stay small that way: on a grown
// store every byte allocated costs garbage-collector work scanning it.
type call struct {
	e     *Executor
	ctx   context.Context
	p     DoParams
	op    operation
	start time.Time // when the request reached idem; events measure from it

	// cp is the claim as the stores see it (with idemcrypt.Config.HashKey,
	// digests of the scope and key; p keeps the client's values for the
	// operation and the logs).
	cp idemstore.ClaimParams
	// triedVersion is set once a mismatch was compared in the record's
	// older fingerprint encoding.
	triedVersion bool
	// w waits for an in-flight record, in wait mode; nil until needed.
	w *waiter

	res *Result
	// x is the execution, once the call owns the claim.
	x *execution
}

// operation is the work a call runs under its claim: an Operation for
// Executor.Do, the middleware's exchange for a request. As an interface
// holding a pointer it costs no allocation of its own.
type operation interface {
	run(ctx context.Context) (*Response, error)
}

func (op Operation) run(ctx context.Context) (*Response, error) { return op(ctx) }

// do runs a call of op for p, for a request that reached idem at start,
// filling res.
func (e *Executor) do(ctx context.Context, p DoParams, op operation, start time.Time, res *Result) (*Result, error) {
	c := call{e: e, ctx: ctx, p: p, op: op, start: start, res: res}
	return c.run()
}

// run is the claim loop: it claims the key and acts on the answer, and
// claims again after waiting for an in-flight record or after finding the
// record's fingerprint in an older encoding.
func (c *call) run() (*Result, error) {
	e := c.e
	storedScope, storedKey := e.cfg.Encryption.StoredKey(c.p.Scope, c.p.Key)
	c.cp = idemstore.ClaimParams{
		Scope:       storedScope,
		Key:         storedKey,
		Fingerprint: c.p.Fingerprint,
		Token:       e.newToken(),
		Lease:       e.cfg.Lease,
		TTL:         e.cfg.TTL,
	}
	defer c.w.close()
	for {
		c.cp.Now = e.cfg.NowFunc()
		var (
			cr  idemstore.ClaimResult
			err error
			tx  *txHolder
		)
		if e.claimer != nil {
			cr, tx, err = c.claimTx()
		} else {
			cr, err = c.claim()
		}
		if err != nil {
			return c.res, c.storeFailure("claim", err)
		}
		c.res.ExpiresAt = cr.Record.ExpiresAt
		switch cr.Outcome {
		case idemstore.ClaimAcquired:
			return c.execute(cr, tx)

		case idemstore.ClaimCompleted:
			return c.res, c.replay(cr.Record.Response)

		case idemstore.ClaimMismatch:
			if c.matchesOlderVersion(cr.Record.Fingerprint) {
				continue
			}
			c.emit(Event{Kind: EventMismatch, Operation: c.p.Operation, Status: 422, Code: CodeKeyReused, Waited: c.res.Waited})
			return c.res, ErrFingerprintMismatch

		case idemstore.ClaimInFlight:
			if err := c.waitInFlight(); err != nil {
				return c.res, err
			}

		default:
			return c.res, c.storeFailure("claim", fmt.Errorf("unknown claim outcome %d", cr.Outcome))
		}
	}
}

// matchesOlderVersion reports whether a record written under an older
// fingerprint encoding matches the request in that encoding; if so, the
// claim is made again with it. It is tried once per call.
func (c *call) matchesOlderVersion(stored string) bool {
	v := fingerprintVersionOf(stored)
	if c.triedVersion || c.p.FingerprintAt == nil || v == fingerprintVersionOf(c.cp.Fingerprint) {
		return false
	}
	c.triedVersion = true
	if fp, ok := c.p.FingerprintAt(v); ok && fp == stored {
		c.cp.Fingerprint = fp
		return true
	}
	return false
}

// waitInFlight answers an in-flight record: ErrInFlight at once without
// Config.Wait, otherwise nil once the record may have changed (the caller
// claims again), or ErrInFlight when Config.Wait has passed.
func (c *call) waitInFlight() error {
	if c.e.cfg.Wait <= 0 {
		c.emit(Event{Kind: EventInFlight, Operation: c.p.Operation, Status: 409, Code: CodeRequestInProgress})
		return idemstore.ErrInFlight
	}
	if c.w == nil {
		c.w = c.e.newWaiter()
	}
	c.res.Waited = true
	err := c.w.wait(c.ctx, c.cp.Scope, c.cp.Key)
	if errors.Is(err, idemstore.ErrInFlight) {
		c.emit(Event{Kind: EventInFlight, Operation: c.p.Operation, Status: 409, Code: CodeRequestInProgress, Waited: true})
	}
	return err
}

// replay returns the stored response of a completed record in c.res.
func (c *call) replay(resp *Response) error {
	e, ctx := c.e, c.ctx
	if resp == nil {
		return c.storeFailure("claim", errors.New("completed record without a response"))
	}
	resp, err := e.cfg.Encryption.Open(ctx, c.p.Scope, c.p.Key, resp)
	if err != nil {
		return e.unreadable(ctx, c.p, c.start, "response", err)
	}
	if resp.Unreplayable {
		c.res.Response = &Response{StatusCode: resp.StatusCode}
		c.emit(Event{Kind: EventUnavailable, Operation: c.p.Operation, Status: resp.StatusCode, Waited: c.res.Waited})
		return ErrResponseUnavailable
	}
	_, end := e.phase(ctx, PhaseReplay, &c.p)
	c.res.Response, c.res.Replayed = resp, true
	end(nil)
	c.emit(Event{Kind: EventReplayed, Operation: c.p.Operation, Status: resp.StatusCode, Waited: c.res.Waited})
	return nil
}

// claim calls Store.Claim within StoreTimeout: a store that stops answering
// must not hold the request for as long as the client waits.
func (c *call) claim() (idemstore.ClaimResult, error) {
	ctx, end := c.e.phase(c.ctx, PhaseClaim, &c.p)
	ctx, cancel := c.e.storeCall(ctx)
	defer cancel()
	cr, err := c.e.store.Claim(ctx, c.cp)
	end(err)
	return cr, err
}

// claimTx calls TxClaimer.ClaimTx within StoreTimeout. On ClaimAcquired
// with a transaction, it returns the transaction in a holder for the
// execution; the transaction's context is not the request's (work that
// was done is recorded even if the client has gone), and it is cancelled
// only if ClaimTx outlives StoreTimeout, or once the transaction ended.
func (c *call) claimTx() (idemstore.ClaimResult, *txHolder, error) {
	e := c.e
	pctx, end := e.phase(c.ctx, PhaseClaim, &c.p)
	h := &txHolder{store: e.claimer, ctx: context.WithoutCancel(pctx), timeout: e.cfg.StoreTimeout}
	var (
		cr idemstore.ClaimResult
		tx idemstore.Tx
	)
	err := h.run(func(ctx context.Context) (err error) {
		cr, tx, err = e.claimer.ClaimTx(ctx, c.cp)
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

// storeFailure logs and reports a failed store call of the claim loop and
// returns it wrapped in ErrStoreUnavailable.
func (c *call) storeFailure(op string, err error) error {
	return c.e.storeFailure(c.ctx, c.p, c.start, op, err)
}

func (c *call) emit(ev Event) { c.e.emit(c.ctx, ev, c.start) }
