package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// Step errors.
var (
	// ErrOutcomeUnknown is what a step function wraps in its error when it
	// cannot tell whether its external effect happened: a timeout, or the
	// connection lost after the request was sent. Step records the step as
	// unknown (visible to the next attempt and to reconcilers) and returns
	// the error; the next attempt runs the step again, with the same
	// derived key (DeriveKey), and the downstream system's own idempotency
	// decides whether it happens a second time (it must not).
	ErrOutcomeUnknown = errors.New("idem: the outcome of the step is unknown")

	// ErrStepsUnsupported is returned by Step outside an idempotent
	// execution, or when the execution's store is not a StepStore: without
	// a recovery point there is nothing to resume from, and running the
	// steps unrecorded would silently repeat them.
	ErrStepsUnsupported = errors.New("idem: steps need an idempotent execution on a StepStore")
)

// StepState is one step of a checkpoint.
type StepState struct {
	// Name is the step's name, unique within the operation.
	Name string `json:"name"`
	// Done reports that the step completed and its recovery point was
	// committed; it never runs again for this record.
	Done bool `json:"done,omitempty"`
	// Unknown reports that the step's last attempt ended with an unknown
	// outcome (ErrOutcomeUnknown) and that it has not completed since.
	Unknown bool `json:"unknown,omitempty"`
	// Data is what the step function returned (Done steps only).
	Data []byte `json:"data,omitempty"`
}

// checkpointVersion is the version of the checkpoint encoding.
const checkpointVersion = 1

type checkpointDoc struct {
	V     int         `json:"v"`
	Steps []StepState `json:"steps"`
}

// MaxCheckpoint bounds an encoded checkpoint: step data is meant to be
// small (identifiers, a provider's charge id), not documents.
const MaxCheckpoint = 64 << 10

// ParseCheckpoint decodes a checkpoint (Record.Checkpoint,
// StuckRecord.Checkpoint) into its steps, in the order they were first
// recorded. An empty checkpoint has no steps. A checkpoint sealed by
// Config.Encryption must be opened first (Encryption.OpenCheckpoint;
// Executor.Reconcile hands its resume function opened ones): ParseCheckpoint
// refuses it with an error wrapping ErrRecordUnreadable.
func ParseCheckpoint(b []byte) ([]StepState, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] != '{' {
		return nil, fmt.Errorf("%w: the checkpoint is encrypted or not JSON: open it with Encryption.OpenCheckpoint", ErrRecordUnreadable)
	}
	if len(b) > MaxCheckpoint {
		return nil, fmt.Errorf("idem: checkpoint of %d bytes, limit %d", len(b), MaxCheckpoint)
	}
	var d checkpointDoc
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("idem: checkpoint: %w", err)
	}
	if d.V != checkpointVersion {
		return nil, fmt.Errorf("idem: checkpoint version %d, want %d", d.V, checkpointVersion)
	}
	return d.Steps, nil
}

// stepRunFrom returns the step state of the execution ctx belongs to, or
// nil outside one.
func stepRunFrom(ctx context.Context) *stepRun {
	x, ok := ctx.Value(execKey{}).(*execution)
	if !ok {
		return nil
	}
	return &x.steps
}

// stepRun is the step state of one execution. It lives in the execution's
// allocation; ss is nil when the store is not a StepStore.
type stepRun struct {
	e      *Executor
	ss     StepStore
	holder *txHolder
	scope  string // the record as stores name it
	key    string
	token  string
	// name is the record as the client named it, with its fingerprint:
	// what a sealed checkpoint is bound to.
	name DoParams

	mu    sync.Mutex
	steps []StepState
	// saved reports that the record holds a checkpoint (inherited by a
	// take-over or saved by this execution).
	saved bool
	err   error
	// suspended reports that the execution ended by keeping the record at
	// its recovery point (set by releaseOrSuspend).
	suspended bool
}

// init prepares the step state of an execution of p under the claim cp;
// checkpoint is the record's recovery point, opened (see openCheckpoint).
func (r *stepRun) init(e *Executor, p DoParams, cp ClaimParams, holder *txHolder, checkpoint []byte) {
	r.e, r.holder, r.scope, r.key, r.token = e, holder, cp.Scope, cp.Key, cp.Token
	r.name = DoParams{Scope: p.Scope, Key: p.Key, Fingerprint: cp.Fingerprint}
	r.ss, _ = e.store.(StepStore)
	if r.ss != nil && len(checkpoint) > 0 {
		r.steps, r.err = ParseCheckpoint(checkpoint)
		r.saved = true
	}
}

// Step runs the step called name of a multi-step operation, at most once
// per record: if an earlier attempt with the same key completed the step
// (its recovery point committed), Step returns the data fn returned then,
// without calling fn. Otherwise it calls fn and, if fn succeeds, commits
// the step's recovery point before returning fn's data:
//
//   - on a transactional store, the writes made through the execution's
//     transaction (TxFromContext) since the previous step, fn's included,
//     commit in the same transaction as the recovery point, and the next
//     TxFromContext begins a new transaction;
//   - otherwise the recovery point is written on its own; fn's effects
//     must then be idempotent by themselves (a derived key, a fence).
//
// The commit is fenced by the owner token: a stale owner (lease lost) gets
// ErrLeaseLost and nothing of its step commits. If fn fails, the
// transactional writes since the previous step roll back and Step returns
// the error; an error wrapping ErrOutcomeUnknown is also recorded in the
// checkpoint. A checkpoint that cannot be decoded makes every Step fail,
// and the record is then kept, never released.
//
// When an operation that saved a recovery point ends without a stored
// outcome (an error, or a response the outcome policy releases), its
// record is not released: it stays in flight with its checkpoint and an
// ended lease, so the next attempt with the same key (or a reconciler,
// see Executor.Reconcile) resumes after the last completed step. Steps
// run in the order the operation calls them; name them uniquely. Step
// data is bounded by MaxCheckpoint in total. With Config.Encryption every
// recovery point is sealed before it is stored, and one that cannot be
// opened is never resumed (ErrRecordUnreadable).
func Step(ctx context.Context, name string, fn func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	r := stepRunFrom(ctx)
	if r == nil || r.ss == nil {
		return nil, ErrStepsUnsupported
	}
	if r.holder != nil && r.holder.claimed {
		return nil, fmt.Errorf("%w: the claim is not committed yet (Config.ClaimInTx), and a recovery point would commit it", ErrStepsUnsupported)
	}
	if name == "" {
		return nil, errors.New("idem: a step needs a name")
	}
	r.mu.Lock()
	if r.err != nil {
		r.mu.Unlock()
		return nil, r.err
	}
	if i := r.find(name); i >= 0 && r.steps[i].Done {
		data := slices.Clone(r.steps[i].Data)
		r.mu.Unlock()
		return data, nil
	}
	r.mu.Unlock()
	// fn runs unlocked, so that it may call StepsFromContext (or another
	// execution's API) freely.
	data, err := fn(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.rollback()
		if errors.Is(err, ErrOutcomeUnknown) {
			if serr := r.save(ctx, StepState{Name: name, Unknown: true}); serr != nil {
				return nil, errors.Join(err, serr)
			}
		}
		return nil, err
	}
	if err := r.save(ctx, StepState{Name: name, Done: true, Data: slices.Clone(data)}); err != nil {
		return nil, err
	}
	return data, nil
}

// StepsFromContext returns the steps recorded so far for the execution
// ctx belongs to (completed ones and those with an unknown outcome), or nil
// outside one.
func StepsFromContext(ctx context.Context) []StepState {
	r := stepRunFrom(ctx)
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.steps)
}

func (r *stepRun) find(name string) int {
	return slices.IndexFunc(r.steps, func(s StepState) bool { return s.Name == name })
}

// rollback discards the open transaction, if any, so that a failed step's
// writes never commit with a later step.
func (r *stepRun) rollback() {
	tx, end := r.holder.take()
	if tx == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.holder.ctx, r.e.cfg.StoreTimeout)
	_ = tx.Rollback(ctx)
	cancel()
	end()
}

// save records st in the checkpoint and commits it: through the open
// transaction, with the step's writes, if there is one.
func (r *stepRun) save(ctx context.Context, st StepState) error {
	steps := slices.Clone(r.steps)
	if i := r.find(st.Name); i >= 0 {
		steps[i] = st
	} else {
		steps = append(steps, st)
	}
	enc, err := json.Marshal(checkpointDoc{V: checkpointVersion, Steps: steps})
	if err != nil {
		return err
	}
	if len(enc) > MaxCheckpoint {
		r.rollback()
		return fmt.Errorf("idem: step %q: checkpoint of %d bytes, limit %d", st.Name, len(enc), MaxCheckpoint)
	}
	// Committing a step that was done must not depend on the client still
	// waiting; StoreTimeout bounds it instead.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.e.cfg.StoreTimeout)
	defer cancel()
	if enc, err = r.seal(sctx, enc); err != nil {
		// Nothing of the step may commit with a later one.
		r.rollback()
		return fmt.Errorf("%w: step %q: %w", ErrStoreUnavailable, st.Name, err)
	}
	p := SaveCheckpointParams{Scope: r.scope, Key: r.key, Token: r.token, Checkpoint: enc}
	tx, end := r.holder.take()
	defer end()
	p.Now = r.e.cfg.NowFunc()
	if tx != nil {
		ct, ok := tx.(CheckpointTx)
		if !ok {
			_ = tx.Rollback(sctx)
			return fmt.Errorf("%w: the store's transaction cannot save a checkpoint", ErrStepsUnsupported)
		}
		err = ct.SaveCheckpoint(sctx, p)
		if err == nil {
			err = tx.Commit(sctx)
		}
		if err != nil {
			_ = tx.Rollback(sctx)
		}
	} else {
		err = r.ss.SaveCheckpoint(sctx, p)
	}
	if err != nil {
		if errors.Is(err, ErrLeaseLost) {
			return fmt.Errorf("idem: step %q: %w", st.Name, ErrLeaseLost)
		}
		return fmt.Errorf("%w: step %q: %w", ErrStoreUnavailable, st.Name, err)
	}
	r.steps, r.saved = steps, true
	return nil
}

// releaseOrSuspend ends an execution that has no stored outcome: a record
// holding a checkpoint stays in flight with its lease ended, so that the
// next attempt resumes after it (the execution is then suspended); any
// other is released. The operation's open transaction rolls back either
// way. A failure other than ErrLeaseLost is logged and reported: the record
// then stays in flight until its lease expires.
func (e *Executor) releaseOrSuspend(ctx context.Context, x *execution, tx StoreTx) error {
	r := &x.steps
	r.mu.Lock()
	keep := r.ss != nil && r.saved
	r.suspended = keep
	r.mu.Unlock()
	if !keep {
		return e.release(ctx, x, tx)
	}
	if tx != nil {
		e.rollback(ctx, tx)
	}
	err := r.suspend(ctx, x.ids)
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: keeping the record at its recovery point failed; it stays in flight until its lease expires",
			slog.String("operation", x.p.Operation), keyAttr(x.p.Key), slog.Any("error", err))
		e.emit(ctx, Event{Kind: EventStoreError, Operation: x.p.Operation, Err: err}, x.start)
	}
	return err
}

// suspend saves the checkpoint again with the lease ended. An unreadable
// checkpoint is not rewritten: releasing would forget the steps that were
// done, so the record is left as it is (fail closed) until its lease ends.
func (r *stepRun) suspend(ctx context.Context, ids ReleaseParams) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	enc, err := json.Marshal(checkpointDoc{V: checkpointVersion, Steps: r.steps})
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, r.e.cfg.StoreTimeout)
	defer cancel()
	if enc, err = r.seal(sctx, enc); err != nil {
		return err
	}
	return r.ss.SaveCheckpoint(sctx, SaveCheckpointParams{
		Scope: ids.Scope, Key: ids.Key, Token: ids.Token, Checkpoint: enc, EndLease: true, Now: r.e.cfg.NowFunc(),
	})
}

// seal returns the form of an encoded checkpoint to store: sealed and
// bound to the record with Config.Encryption, as it is without.
func (r *stepRun) seal(ctx context.Context, enc []byte) ([]byte, error) {
	return r.e.cfg.Encryption.SealCheckpoint(ctx, r.name.Scope, r.name.Key, r.name.Fingerprint, enc)
}

// openCheckpoint returns the recovery point a claim of p returned (stored,
// possibly sealed), opened with Config.Encryption. If it cannot be opened,
// the operation must not run: its steps would start again from nothing. The
// record then keeps its stored checkpoint as it is (a restored key can
// still open it) with its lease ended, so that the next attempt is not
// held up for a lease, and the error, wrapping ErrRecordUnreadable, is
// logged and reported.
func (e *Executor) openCheckpoint(ctx context.Context, p DoParams, cp ClaimParams, stored []byte, start time.Time) ([]byte, error) {
	if len(stored) == 0 {
		return nil, nil
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.StoreTimeout)
	defer cancel()
	plain, err := e.cfg.Encryption.OpenCheckpoint(sctx, p.Scope, p.Key, cp.Fingerprint, stored)
	if err == nil {
		return plain, nil
	}
	if ss, ok := e.store.(StepStore); ok {
		if kerr := ss.SaveCheckpoint(sctx, SaveCheckpointParams{Scope: cp.Scope, Key: cp.Key, Token: cp.Token,
			Checkpoint: stored, EndLease: true, Now: e.cfg.NowFunc()}); kerr != nil && !errors.Is(kerr, ErrLeaseLost) {
			e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: ending the lease of a record whose recovery point cannot be decrypted failed; it stays in flight until its lease expires",
				slog.String("operation", p.Operation), keyAttr(p.Key), slog.Any("error", kerr))
		}
	}
	return nil, e.unreadable(ctx, p, start, "recovery point", err)
}

// reconcileOne resumes one stuck record; ErrInFlight means another
// attempt is running it.
func (e *Executor) reconcileOne(ctx context.Context, p ReconcileParams, rec StuckRecord, resume func(ctx context.Context, rec StuckRecord) (Operation, error)) error {
	// The resume function reads the steps: it gets them opened. Do opens
	// the checkpoint again from its own claim.
	octx, cancel := context.WithTimeout(ctx, e.cfg.StoreTimeout)
	cp, err := e.cfg.Encryption.OpenCheckpoint(octx, rec.Scope, rec.Key, rec.Fingerprint, rec.Checkpoint)
	cancel()
	if err != nil {
		return err
	}
	rec.Checkpoint = cp
	op, err := resume(ctx, rec)
	if err != nil {
		return err
	}
	r, err := e.Do(ctx, DoParams{Scope: rec.Scope, Key: rec.Key, Fingerprint: rec.Fingerprint, Operation: p.Operation}, op)
	if err == nil && (r.Released || r.Suspended) {
		err = errors.New("the operation ended without a stored outcome")
	}
	return err
}

// take hands over the open transaction, if any, with the function that
// ends its context once it is committed or rolled back; the next get
// begins a new transaction. A nil holder holds nothing.
func (h *txHolder) take() (StoreTx, func()) {
	if h == nil {
		return nil, func() {}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	tx, cancel := h.tx, h.cancel
	h.tx, h.err, h.cancel = nil, nil, nil
	return tx, func() {
		if cancel != nil {
			cancel(nil)
		}
	}
}

// ReconcileParams are the arguments of Executor.Reconcile.
type ReconcileParams struct {
	// Limit bounds the operations resumed by one call. Defaults to 100.
	Limit int
	// Operation names the operation in events and logs. Defaults to
	// "reconcile".
	Operation string
}

// ReconcileResult reports what one Executor.Reconcile call did.
type ReconcileResult struct {
	// Found is the number of stuck operations the store returned.
	Found int
	// Completed is the number that ran to a stored outcome.
	Completed int
	// Failed is the number whose resumption failed; the error returned
	// joins their errors. They stay stuck and are found again.
	Failed int
}

// Reconcile drives operations stuck after a recovery point to completion:
// operations whose attempt died (a crash, a lost lease, a provider that
// stayed down) after saving a step, and that no client retried. For each
// stuck record the store returns, resume returns the operation to run (the
// same code the original request ran, rebuilt from the record's steps and
// the application's own state); Reconcile runs it through Do with the
// record's scope, key and fingerprint, so that it takes the record over,
// skips the completed steps and calls downstream systems again with the
// same derived keys. An operation that another attempt is running
// (ErrInFlight) is left to it. Run Reconcile periodically, from one or many
// instances: the claims keep each operation to one runner at a time.
// resume gets the record's checkpoint opened (see Config.Encryption); a
// record whose checkpoint cannot be opened counts as failed, with an error
// wrapping ErrRecordUnreadable, and is not resumed.
//
// It returns ErrStepsUnsupported if the store is not a StepStore, and with
// EncryptionConfig.HashKey, whose records do not hold the client's key.
func (e *Executor) Reconcile(ctx context.Context, p ReconcileParams, resume func(ctx context.Context, rec StuckRecord) (Operation, error)) (ReconcileResult, error) {
	var res ReconcileResult
	ss, ok := e.store.(StepStore)
	if !ok {
		return res, ErrStepsUnsupported
	}
	if e.cfg.Encryption != nil && e.cfg.Encryption.hashKey != nil {
		// The records hold digests of the scope and key: the client's key,
		// which DeriveKey and the sealed response need, is not stored.
		// Clients' retries still resume their operations.
		return res, fmt.Errorf("%w: Reconcile cannot resume records whose names are hashed (EncryptionConfig.HashKey)", ErrStepsUnsupported)
	}
	if p.Limit <= 0 {
		p.Limit = 100
	}
	if p.Operation == "" {
		p.Operation = "reconcile"
	}
	sctx, cancel := context.WithTimeout(ctx, e.cfg.StoreTimeout)
	recs, err := ss.Stuck(sctx, StuckParams{Limit: p.Limit, Now: e.cfg.NowFunc()})
	cancel()
	if err != nil {
		return res, fmt.Errorf("%w: stuck: %w", ErrStoreUnavailable, err)
	}
	res.Found = len(recs)
	var errs []error
	for _, rec := range recs {
		if err := ctx.Err(); err != nil {
			return res, errors.Join(append(errs, err)...)
		}
		err := e.reconcileOne(ctx, p, rec, resume)
		switch {
		case errors.Is(err, ErrInFlight):
		case err != nil:
			res.Failed++
			errs = append(errs, fmt.Errorf("idem: reconcile %s: %w", RedactKey(rec.Key), err))
		default:
			res.Completed++
		}
	}
	return res, errors.Join(errs...)
}
