package idem

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
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
	// server, so they need uniqueness, not secrecy. They are made in
	// batches, back to back in one string, so that a claim costs no
	// allocation for its token.
	tokenPrefix string
	tokenSeq    atomic.Uint64
	tokens      tokenBatch

	// unstalling reports that the request path's store calls cannot
	// stall, so that they need no deadline of their own (see storeCall).
	unstalling bool

	// renewals schedules the lease renewals of running operations.
	renewals renewals
}

// storeCall returns the context for one store call of the request path
// (claim, complete, release), bounded by StoreTimeout so that a store that
// stops answering cannot hold a request for as long as its client waits.
// A store whose calls cannot stall gets no deadline: memstore's are map
// operations under a shard's lock, with no I/O and no wait on another
// caller. Without encryption (a key provider may call out) such a call
// skips the runtime timer and four allocations a deadline costs
// (docs/BENCHMARKS.md). A store that wraps a memstore is not a memstore:
// it keeps its deadlines.
func (e *Executor) storeCall(ctx context.Context) (context.Context, context.CancelFunc) {
	if e.unstalling {
		return ctx, noCancel
	}
	return context.WithTimeout(ctx, e.cfg.StoreTimeout)
}

func noCancel() {}

func (e *Executor) newToken() string {
	t := &e.tokens
	t.mu.Lock()
	if t.left == 0 {
		t.refill(e.tokenPrefix, e.tokenSeq.Add(tokenBatchSize)-tokenBatchSize+1)
	}
	i := tokenBatchSize - t.left
	t.left--
	start := 0
	if i > 0 {
		start = int(t.ends[i-1])
	}
	tok := t.text[start:t.ends[i]]
	t.mu.Unlock()
	return tok
}

// tokenBatchSize is the number of owner tokens made at once.
const tokenBatchSize = 32

// tokenBatch holds owner tokens made ahead: text is the tokens back to
// back, ends[i] the end of the i-th, and left how many are unused (the
// last ones). A token is a substring of text: a store that keeps it keeps
// the batch's string (about a kilobyte) alive with it.
type tokenBatch struct {
	mu   sync.Mutex
	text string
	ends [tokenBatchSize]uint16
	left int
}

// refill makes the tokens of the counter values first to
// first+tokenBatchSize-1, each prefix followed by its value in base 36.
func (t *tokenBatch) refill(prefix string, first uint64) {
	var b strings.Builder
	b.Grow(tokenBatchSize * (len(prefix) + 13)) // 13 base-36 digits hold any uint64
	var digits [13]byte
	for i := range uint64(tokenBatchSize) {
		b.WriteString(prefix)
		b.Write(strconv.AppendUint(digits[:0], first+i, 36))
		t.ends[i] = uint16(b.Len())
	}
	t.text, t.left = b.String(), tokenBatchSize
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
	_, inMemory := store.(*memstore.Store)
	e.unstalling = inMemory && rc.Encryption == nil
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
