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

	"github.com/idemhq/idem/idemstore"
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
	// Since is when the operation's first recovery point was saved, by
	// the core's clock: the start of its age (ReconcileParams.MaxAge).
	Since time.Time `json:"since,omitzero"`
	// Attempts counts the attempts that ended without a stored outcome
	// (suspensions), a client's and the reconciler's alike
	// (ReconcileParams.MaxAttempts).
	Attempts int `json:"attempts,omitempty"`
	// Held reports that the record is held for an operator: once set, it
	// stays set until the operation reaches a stored outcome.
	Held bool `json:"held,omitempty"`
}

// ParseCheckpoint decodes a checkpoint (Record.Checkpoint,
// StuckRecord.Checkpoint) into its steps, in the order they were first
// recorded. An empty checkpoint has no steps. A checkpoint sealed by
// Config.Encryption must be opened first (Encryption.OpenCheckpoint;
// Executor.Reconcile hands its resume function opened ones): ParseCheckpoint
// refuses it with an error wrapping ErrRecordUnreadable.
func ParseCheckpoint(b []byte) ([]StepState, error) {
	d, err := parseCheckpointDoc(b)
	return d.Steps, err
}

// CheckpointInfo is what a checkpoint records about its operation: its
// steps, and what reconciliation counts (ReconcileParams.MaxAttempts,
// MaxAge).
type CheckpointInfo struct {
	// Steps are the steps in the order they were first recorded.
	Steps []StepState
	// Since is when the operation's first recovery point was saved, by
	// the core's clock; zero when the checkpoint does not say.
	Since time.Time
	// Attempts counts the attempts that ended without a stored outcome,
	// a client's and the reconciler's alike.
	Attempts int
	// Held reports that reconciliation gave up on the operation: the
	// record is held for an operator (idemstore.Record.Held).
	Held bool
}

// ParseCheckpointInfo decodes a checkpoint as ParseCheckpoint does, with
// its attempts, age and hold.
func ParseCheckpointInfo(b []byte) (CheckpointInfo, error) {
	d, err := parseCheckpointDoc(b)
	if err != nil {
		return CheckpointInfo{}, err
	}
	return CheckpointInfo{Steps: d.Steps, Since: d.Since, Attempts: d.Attempts, Held: d.Held}, nil
}

func parseCheckpointDoc(b []byte) (checkpointDoc, error) {
	var d checkpointDoc
	if len(b) == 0 {
		return d, nil
	}
	if b[0] != '{' {
		return d, fmt.Errorf("%w: the checkpoint is encrypted or not JSON: open it with Encryption.OpenCheckpoint", ErrRecordUnreadable)
	}
	if len(b) > idemstore.MaxCheckpoint {
		return d, fmt.Errorf("idem: checkpoint of %d bytes, limit %d", len(b), idemstore.MaxCheckpoint)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return checkpointDoc{}, fmt.Errorf("idem: checkpoint: %w", err)
	}
	if d.V != checkpointVersion {
		return checkpointDoc{}, fmt.Errorf("idem: checkpoint version %d, want %d", d.V, checkpointVersion)
	}
	if d.Attempts < 0 {
		return checkpointDoc{}, fmt.Errorf("idem: checkpoint with %d attempts", d.Attempts)
	}
	return d, nil
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
// allocation; ss is nil when the store is not a StepStore. The executor,
// the transaction holder and the record's names are the execution's (x):
// not copied here, they keep the execution within a smaller size class,
// every byte of which is allocated per execution.
type stepRun struct {
	x  *execution
	ss idemstore.StepStore
	// fingerprint is the record's, as claimed (perhaps in an older
	// version than x.p's): with the record's names as the client gave
	// them (x.p), what a sealed checkpoint is bound to.
	fingerprint string

	mu sync.Mutex
	// doc is the checkpoint as last saved or inherited, with the steps
	// recorded so far.
	doc checkpointDoc
	// raw is the inherited checkpoint as stored, kept for holding a record
	// whose checkpoint cannot be decoded (err).
	raw []byte
	err error
	// saved reports that the record holds a checkpoint (inherited by a
	// take-over or saved by this execution). It sits with the other
	// flags: apart, its padding took 8 bytes of the execution's.
	saved bool
	// suspended reports that the execution ended by keeping the record at
	// its recovery point (set by releaseOrSuspend), and held that it was
	// kept held for an operator.
	suspended, held bool
}

// init prepares the step state of an execution of p under the claim cp;
// checkpoint is the record's recovery point, opened (see openCheckpoint).
func (r *stepRun) init(x *execution, cp idemstore.ClaimParams, checkpoint []byte) {
	r.x, r.fingerprint = x, cp.Fingerprint
	r.ss, _ = x.e.store.(idemstore.StepStore)
	if r.ss != nil && len(checkpoint) > 0 {
		r.doc, r.err = parseCheckpointDoc(checkpoint)
		r.raw, r.saved = checkpoint, true
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
	if r.x.claimed() {
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
	if i := r.find(name); i >= 0 && r.doc.Steps[i].Done {
		data := slices.Clone(r.doc.Steps[i].Data)
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
	return slices.Clone(r.doc.Steps)
}

func (r *stepRun) find(name string) int {
	return slices.IndexFunc(r.doc.Steps, func(s StepState) bool { return s.Name == name })
}

// rollback discards the open transaction, if any, so that a failed step's
// writes never commit with a later step.
func (r *stepRun) rollback() {
	tx, end := r.x.tx.take()
	if tx == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.x.tx.ctx, r.x.e.cfg.StoreTimeout)
	_ = tx.Rollback(ctx)
	cancel()
	end()
}

// save records st in the checkpoint and commits it: through the open
// transaction, with the step's writes, if there is one.
func (r *stepRun) save(ctx context.Context, st StepState) error {
	doc := r.doc
	doc.V, doc.Steps = checkpointVersion, slices.Clone(r.doc.Steps)
	if i := r.find(st.Name); i >= 0 {
		doc.Steps[i] = st
	} else {
		doc.Steps = append(doc.Steps, st)
	}
	if doc.Since.IsZero() {
		doc.Since = r.x.e.cfg.NowFunc().UTC()
	}
	enc, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	if len(enc) > idemstore.MaxCheckpoint {
		r.rollback()
		return fmt.Errorf("idem: step %q: checkpoint of %d bytes, limit %d", st.Name, len(enc), idemstore.MaxCheckpoint)
	}
	// Committing a step that was done must not depend on the client still
	// waiting; StoreTimeout bounds it instead.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.x.e.cfg.StoreTimeout)
	defer cancel()
	if enc, err = r.seal(sctx, enc); err != nil {
		// Nothing of the step may commit with a later one.
		r.rollback()
		return fmt.Errorf("%w: step %q: %w", ErrStoreUnavailable, st.Name, err)
	}
	ids := &r.x.ids
	p := idemstore.SaveCheckpointParams{Scope: ids.scope, Key: ids.key, Token: ids.token, Checkpoint: enc}
	tx, end := r.x.tx.take()
	defer end()
	p.Now = r.x.e.cfg.NowFunc()
	if tx != nil {
		ct, ok := tx.(idemstore.CheckpointTx)
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
		if errors.Is(err, idemstore.ErrLeaseLost) {
			return fmt.Errorf("idem: step %q: %w", st.Name, idemstore.ErrLeaseLost)
		}
		return fmt.Errorf("%w: step %q: %w", ErrStoreUnavailable, st.Name, err)
	}
	r.doc, r.saved = doc, true
	return nil
}

// releaseOrSuspend ends an execution that has no stored outcome: a record
// holding a checkpoint stays in flight with its lease ended, so that the
// next attempt resumes after it (the execution is then suspended); any
// other is released. The operation's open transaction rolls back either
// way. A failure other than ErrLeaseLost is logged and reported: the record
// then stays in flight until its lease expires.
func (x *execution) releaseOrSuspend(ctx context.Context, tx idemstore.Tx) error {
	e, r := x.e, &x.steps
	r.mu.Lock()
	keep := r.ss != nil && r.saved
	r.suspended = keep
	r.mu.Unlock()
	if !keep {
		return x.release(ctx, tx)
	}
	if tx != nil {
		e.rollback(ctx, tx)
	}
	newlyHeld, err := r.suspend(ctx, x.ids, x.p.hold)
	if err != nil && !errors.Is(err, idemstore.ErrLeaseLost) {
		e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: keeping the record at its recovery point failed; it stays in flight until its lease expires",
			slog.String("operation", x.p.Operation), keyAttr(x.p.Key), slog.Any("error", err))
		e.emit(ctx, Event{Kind: EventStoreError, Operation: x.p.Operation, Err: err}, x.start)
	}
	if newlyHeld {
		r.mu.Lock()
		attempts, since := r.doc.Attempts, r.doc.Since
		r.mu.Unlock()
		attrs := []slog.Attr{slog.String("operation", x.p.Operation), keyAttr(x.p.Key), slog.Int("attempts", attempts)}
		if !since.IsZero() {
			attrs = append(attrs, slog.Duration("age", e.cfg.NowFunc().Sub(since).Round(time.Second)))
		}
		e.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "idem: the operation is held for an operator: reconciliation no longer resumes it (a retry with its key still does)", attrs...)
	}
	return err
}

// holdPolicy decides when a reconciling execution holds its record for an
// operator (ReconcileParams.MaxAttempts, MaxAge). A nil policy (a client's
// attempt) never holds a record that is not held already.
type holdPolicy struct {
	maxAttempts int
	maxAge      time.Duration
	// always holds the record whatever its attempts and age: the
	// reconciler could not rebuild the operation.
	always bool
}

// holds reports whether d, which has ended one more attempt, must be held.
func (p *holdPolicy) holds(d checkpointDoc, now time.Time) bool {
	switch {
	case p == nil:
		return false
	case p.always:
		return true
	case p.maxAttempts > 0 && d.Attempts >= p.maxAttempts:
		return true
	}
	return p.maxAge > 0 && !d.Since.IsZero() && now.Sub(d.Since) >= p.maxAge
}

// suspend saves the checkpoint again with the lease ended, one more attempt
// counted, and held for an operator if it was already or pol says so; it
// reports whether this made the record held. An unreadable checkpoint is not
// rewritten: releasing would forget the steps that were done, so the record
// is left as it is (fail closed) until its lease ends, unless pol holds it
// whatever its state, which saves the inherited bytes back unchanged.
func (r *stepRun) suspend(ctx context.Context, ids recordIDs, pol *holdPolicy) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.x.e.cfg.NowFunc()
	p := idemstore.SaveCheckpointParams{Scope: ids.scope, Key: ids.key, Token: ids.token, EndLease: true, Now: now}
	doc := r.doc
	if r.err != nil {
		if pol == nil || !pol.always {
			return false, r.err
		}
		p.Checkpoint, p.Hold = r.raw, true
	} else {
		doc.V = checkpointVersion
		doc.Attempts++
		if doc.Since.IsZero() {
			doc.Since = now.UTC() // a checkpoint saved before ages were kept
		}
		doc.Held = doc.Held || pol.holds(doc, now)
		enc, err := json.Marshal(doc)
		if err != nil {
			return false, err
		}
		p.Checkpoint, p.Hold = enc, doc.Held
	}
	sctx, cancel := context.WithTimeout(ctx, r.x.e.cfg.StoreTimeout)
	defer cancel()
	// What is saved is sealed as every checkpoint is (r.raw is the
	// inherited checkpoint as opened, see openCheckpoint).
	var err error
	if p.Checkpoint, err = r.seal(sctx, p.Checkpoint); err != nil {
		return false, err
	}
	if err := r.ss.SaveCheckpoint(sctx, p); err != nil {
		return false, err
	}
	newly := p.Hold && !r.doc.Held
	r.doc, r.held = doc, p.Hold
	return newly, nil
}

// seal returns the form of an encoded checkpoint to store: sealed and
// bound to the record with Config.Encryption, as it is without.
func (r *stepRun) seal(ctx context.Context, enc []byte) ([]byte, error) {
	return r.x.e.cfg.Encryption.SealCheckpoint(ctx, r.x.p.Scope, r.x.p.Key, r.fingerprint, enc)
}

// openCheckpoint returns the recovery point a claim of p returned (stored,
// possibly sealed), opened with Config.Encryption. If it cannot be opened,
// the operation must not run: its steps would start again from nothing. The
// record then keeps its stored checkpoint as it is (a restored key can
// still open it) with its lease ended, so that the next attempt is not
// held up for a lease, and the error, wrapping ErrRecordUnreadable, is
// logged and reported.
func (e *Executor) openCheckpoint(ctx context.Context, p DoParams, cp idemstore.ClaimParams, stored []byte, start time.Time) ([]byte, error) {
	if len(stored) == 0 {
		return nil, nil
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.StoreTimeout)
	defer cancel()
	plain, err := e.cfg.Encryption.OpenCheckpoint(sctx, p.Scope, p.Key, cp.Fingerprint, stored)
	if err == nil {
		return plain, nil
	}
	if ss, ok := e.store.(idemstore.StepStore); ok {
		if kerr := ss.SaveCheckpoint(sctx, idemstore.SaveCheckpointParams{Scope: cp.Scope, Key: cp.Key, Token: cp.Token,
			Checkpoint: stored, EndLease: true, Now: e.cfg.NowFunc()}); kerr != nil && !errors.Is(kerr, idemstore.ErrLeaseLost) {
			e.cfg.Logger.LogAttrs(ctx, slog.LevelError, "idem: ending the lease of a record whose recovery point cannot be decrypted failed; it stays in flight until its lease expires",
				slog.String("operation", p.Operation), keyAttr(p.Key), slog.Any("error", kerr))
		}
	}
	return nil, e.unreadable(ctx, p, start, "recovery point", err)
}

// take hands over the open transaction, if any, with the function that
// ends its context once it is committed or rolled back; the next get
// begins a new transaction. A nil holder holds nothing.
func (h *txHolder) take() (idemstore.Tx, func()) {
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
	// Concurrency bounds the operations one call resumes at the same
	// time, so that a slow or hopeless operation holds up only its own
	// slot. Defaults to 4.
	Concurrency int
	// MaxAttempts bounds the life of an operation under reconciliation:
	// once this many of its attempts (a client's included) have ended
	// without a stored outcome, the attempt that reached it holds the
	// record for an operator (see Record.Held). Zero means no limit
	// beyond the record's TTL, which a take-over never extends. Defaults
	// to no limit.
	MaxAttempts int
	// MaxAge is MaxAttempts by age: an attempt that ends without a stored
	// outcome this long or longer after the operation's first recovery
	// point holds the record. Zero means no limit beyond the TTL.
	// Defaults to no limit.
	MaxAge time.Duration
}

// ReconcileResult reports what one Executor.Reconcile call did.
type ReconcileResult struct {
	// Found is the number of stuck operations the store returned.
	Found int
	// Completed is the number that ran to a stored outcome.
	Completed int
	// Failed is the number whose resumption failed; the error returned
	// joins their errors. They stay stuck and are found again, unless
	// they were held.
	Failed int
	// Held is the number of the failed ones that this call held for an
	// operator (MaxAttempts, MaxAge, or an operation that resume could
	// not rebuild): Stuck no longer returns them, so no later call
	// resumes them.
	Held int
}

// Reconcile drives operations stuck after a recovery point to completion:
// operations whose attempt died (a crash, a lost lease, a provider that
// stayed down) after saving a step, and that no client retried. For each
// stuck record the store returns (oldest lease first, so that an operation
// resumed in vain goes to the back), resume returns the operation to run
// (the same code the original request ran, rebuilt from the record's steps
// and the application's own state); Reconcile runs it through Do with the
// record's scope, key and fingerprint, so that it takes the record over,
// skips the completed steps and calls downstream systems again with the
// same derived keys. Up to Concurrency operations run at once. An
// operation that another attempt is running (ErrInFlight) is left to it.
// Run Reconcile periodically, from one or many instances: the claims keep
// each operation to one runner at a time. resume gets the record's
// checkpoint opened (see Config.Encryption); a record whose checkpoint
// cannot be opened counts as failed, with an error wrapping
// ErrRecordUnreadable, and is not resumed.
//
// Reconciliation has a bounded life. An operation whose attempts reach
// MaxAttempts, whose age reaches MaxAge, or whose operation resume cannot
// rebuild (it returns an error) is held for an operator: it stays in
// flight with its checkpoint until its TTL ends, Stuck returns it only
// with StuckParams.Held, and Reconcile never resumes it again. A client's
// retry with the same key still resumes it, and it stays held if that
// attempt ends without an outcome too. The record's retention is never
// extended by a take-over, so every record, held or not, ends with its
// TTL.
//
// It returns ErrStepsUnsupported if the store is not a StepStore, and with
// idemcrypt.Config.HashKey, whose records do not hold the client's key.
func (e *Executor) Reconcile(ctx context.Context, p ReconcileParams, resume func(ctx context.Context, rec idemstore.StuckRecord) (Operation, error)) (ReconcileResult, error) {
	var res ReconcileResult
	ss, ok := e.store.(idemstore.StepStore)
	if !ok {
		return res, ErrStepsUnsupported
	}
	if e.cfg.Encryption.HashesKeys() {
		// The records hold digests of the scope and key: the client's key,
		// which DeriveKey and the sealed response need, is not stored.
		// Clients' retries still resume their operations.
		return res, fmt.Errorf("%w: Reconcile cannot resume records whose names are hashed (idemcrypt.Config.HashKey)", ErrStepsUnsupported)
	}
	if p.MaxAttempts < 0 || p.MaxAge < 0 || p.Limit < 0 || p.Concurrency < 0 {
		return res, fmt.Errorf("idem: ReconcileParams: negative Limit (%d), Concurrency (%d), MaxAttempts (%d) or MaxAge (%v)",
			p.Limit, p.Concurrency, p.MaxAttempts, p.MaxAge)
	}
	if p.Limit == 0 {
		p.Limit = 100
	}
	if p.Concurrency == 0 {
		p.Concurrency = 4
	}
	if p.Operation == "" {
		p.Operation = "reconcile"
	}
	sctx, cancel := context.WithTimeout(ctx, e.cfg.StoreTimeout)
	recs, err := ss.Stuck(sctx, idemstore.StuckParams{Limit: p.Limit, Now: e.cfg.NowFunc()})
	cancel()
	if err != nil {
		return res, fmt.Errorf("%w: stuck: %w", ErrStoreUnavailable, err)
	}
	res.Found = len(recs)
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	slots := make(chan struct{}, p.Concurrency)
	for _, rec := range recs {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			// Those not started yet stay stuck for the next call.
			mu.Lock()
			errs = append(errs, ctx.Err())
			mu.Unlock()
			break
		}
		wg.Go(func() {
			defer func() { <-slots }()
			done, held, err := e.reconcileOne(ctx, p, rec, resume)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case done:
				res.Completed++
			case err != nil:
				res.Failed++
				if held {
					res.Held++
				}
				errs = append(errs, fmt.Errorf("idem: reconcile %s: %w", RedactKey(rec.Key), err))
			}
		})
	}
	wg.Wait()
	return res, errors.Join(errs...)
}

// reconcileOne resumes one stuck operation. It reports whether the
// operation reached a stored outcome, and otherwise whether its record is
// held now and why it failed; an operation another attempt is running is
// neither done nor failed.
func (e *Executor) reconcileOne(ctx context.Context, p ReconcileParams, rec idemstore.StuckRecord, resume func(ctx context.Context, rec idemstore.StuckRecord) (Operation, error)) (done, held bool, err error) {
	// The resume function reads the steps: it gets them opened. Do opens
	// the checkpoint again from its own claim.
	octx, cancel := context.WithTimeout(ctx, e.cfg.StoreTimeout)
	opened, err := e.cfg.Encryption.OpenCheckpoint(octx, rec.Scope, rec.Key, rec.Fingerprint, rec.Checkpoint)
	cancel()
	if err != nil {
		return false, false, err
	}
	rec.Checkpoint = opened
	pol := &holdPolicy{maxAttempts: p.MaxAttempts, maxAge: p.MaxAge}
	op, rerr := resume(ctx, rec)
	if rerr != nil {
		// Without its operation the record would be found again on every
		// call, and never progress: it is held at once.
		pol.always = true
		op = func(context.Context) (*Response, error) { return nil, rerr }
	}
	r, err := e.Do(ctx, DoParams{Scope: rec.Scope, Key: rec.Key, Fingerprint: rec.Fingerprint, Operation: p.Operation, hold: pol}, op)
	switch {
	case errors.Is(err, idemstore.ErrInFlight):
		return false, false, nil
	case err == nil && (r.Released || r.Suspended):
		err = errors.New("the operation ended without a stored outcome")
	}
	if rerr != nil && errors.Is(err, rerr) {
		err = fmt.Errorf("resume: %w", rerr)
	}
	return err == nil, r.Held, err
}
