package idemstore

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// This file is the store author's API: the Store interface, its parameter
// and result types, its sentinel errors and its optional capabilities
// (TxStore, Tx, TxClaimer, TxRenewer, Watcher, StepStore,
// CheckpointTx). An application that only uses idem never needs these
// names. How stable they are is stated under "For store
// authors" in the package documentation (doc.go).

// MaxCheckpoint bounds an encoded checkpoint (see StepStore): step data is
// meant to be small (identifiers, a provider's charge id), not documents.
// A StepStore holds checkpoints of at least this size, sealed ones (up to
// 8 KiB more) included.
const MaxCheckpoint = 64 << 10

// Store errors. Stores return them, possibly wrapped, and callers test them
// with errors.Is.
var (
	// ErrLeaseLost is returned by Renew, Complete and Release (and their
	// transactional forms) when the owner token no longer owns an in-flight
	// record: the record is absent, was completed, or another claim took it
	// over after the lease expired. This is the fencing rule: a stale owner
	// can change nothing.
	ErrLeaseLost = errors.New("idem: lease lost: the record is no longer owned by this token")

	// ErrResponseTooLarge is returned by Complete when a store cannot hold
	// the response it is given. The core then completes the record without a
	// body (see Response.Unreplayable) so that the operation is still never
	// executed twice. Stores must hold at least DefaultMaxResponseBody bytes
	// of body plus its header fields by default, so that the middleware's
	// default limit, not the store's, decides what is replayable.
	ErrResponseTooLarge = errors.New("idem: response too large for the store")

	// ErrStoreFull is returned by Claim when a store with a bounded capacity
	// (memstore) has no room for a new record. The middleware answers it as
	// any store failure: 503, the handler does not run.
	ErrStoreFull = errors.New("idem: store is full")

	// ErrInFlight is returned by Inspector.Delete for an in-flight record
	// without DeleteParams.Force; the core's Executor.Do returns it (as
	// idem.ErrInFlight) for a duplicate of a running request.
	ErrInFlight = errors.New("idem: a request with this key is in progress")
)

// Store keeps idempotency records. A record is identified by (scope, key),
// holds the request fingerprint, and is either in flight (owned by one token
// under a lease) or completed (holding the response to replay). Records
// expire at ExpiresAt and then behave as absent.
//
// Every method is one atomic step: concurrent calls from any number of
// goroutines or processes sharing the store behave as if run one at a time.
// Stores decide time with the Now given in the parameters (the core's one
// clock) unless they document that they use their server's clock instead
// (PostgreSQL, Redis); they never call time.Now themselves.
//
// Errors other than the sentinels named below mean the store could not
// answer; the middleware turns them into 503 and fails closed.
//
// storetest.Run checks an implementation against this contract.
type Store interface {
	// Claim atomically looks up (Scope, Key) and returns what it found:
	//
	//   - no record, or one that has expired: insert an in-flight record
	//     owned by Token, with a lease until Now+Lease and retention until
	//     Now+TTL, and return ClaimAcquired;
	//   - a record whose fingerprint differs from Fingerprint (compared as
	//     strings, in any state): ClaimMismatch, the record unchanged;
	//   - a completed record: ClaimCompleted with its response;
	//   - an in-flight record whose lease has not expired: ClaimInFlight;
	//   - an in-flight record whose lease has expired: take it over (new
	//     owner Token, new lease until Now+Lease, its retention unchanged)
	//     and return ClaimAcquired with TookOver set. A take-over never
	//     extends ExpiresAt: a record ends TTL after the claim that created
	//     it, however often it is taken over, so that an operation resumed
	//     in vain cannot keep its record forever. A store that cannot take
	//     it over promptly (sqlitestore waits at most 100 ms for its write
	//     lock, most likely held by the old owner's transaction) may answer
	//     ClaimInFlight instead: the caller retries, and nothing runs twice.
	//
	// The returned Record describes the record after the call; it never
	// carries another owner's token.
	Claim(ctx context.Context, p ClaimParams) (ClaimResult, error)

	// Renew extends the lease of the in-flight record owned by Token to
	// Now+Lease. It returns ErrLeaseLost if Token does not own an in-flight
	// record at (Scope, Key). A lease that expired but was not taken over is
	// still owned and can be renewed.
	Renew(ctx context.Context, p RenewParams) error

	// Complete stores Response and marks the in-flight record owned by Token
	// completed; its retention (ExpiresAt) is unchanged. It returns
	// ErrLeaseLost if Token does not own an in-flight record, and
	// ErrResponseTooLarge (changing nothing) if the store cannot hold the
	// response. The caller never modifies Response afterwards, so a store
	// may keep it; likewise callers treat the Response returned by Claim
	// as read-only.
	Complete(ctx context.Context, p CompleteParams) error

	// Release deletes the in-flight record owned by Token, so that the key
	// can be used again. It returns ErrLeaseLost if Token does not own an
	// in-flight record.
	Release(ctx context.Context, p ReleaseParams) error

	// DeleteExpired deletes at most Limit records whose retention ended at or
	// before Now, and returns how many it deleted. Callers repeat it until it
	// returns fewer than Limit. It never deletes an unexpired record. A store
	// whose backend deletes expired records itself (Redis) returns 0.
	DeleteExpired(ctx context.Context, p DeleteExpiredParams) (int, error)
}

// ClaimParams are the arguments of Store.Claim.
type ClaimParams struct {
	Scope       string
	Key         string
	Fingerprint string
	// Token is the owner token for a new or taken-over record: an
	// unguessable value the core generates for every claim.
	Token string
	// Lease is how long the claim holds the record without renewal.
	Lease time.Duration
	// TTL is how long a record that this claim creates is retained from
	// Now; a take-over keeps the record's retention as it is.
	TTL time.Duration
	// Now is the core clock's reading.
	Now time.Time
}

// RenewParams are the arguments of Store.Renew.
type RenewParams struct {
	Scope, Key, Token string
	Lease             time.Duration
	Now               time.Time
}

// CompleteParams are the arguments of Store.Complete.
type CompleteParams struct {
	Scope, Key, Token string
	Response          *Response
	Now               time.Time
}

// ReleaseParams are the arguments of Store.Release.
type ReleaseParams struct {
	Scope, Key, Token string
	Now               time.Time
}

// DeleteExpiredParams are the arguments of Store.DeleteExpired.
type DeleteExpiredParams struct {
	// Limit bounds the records deleted by one call. It must be positive.
	Limit int
	Now   time.Time
}

// ClaimOutcome says what Store.Claim found.
type ClaimOutcome int

// The outcomes of a claim.
const (
	// ClaimAcquired: the caller now owns an in-flight record and must
	// execute the operation, then Complete or Release it.
	ClaimAcquired ClaimOutcome = iota + 1
	// ClaimCompleted: the operation completed; Record.Response is its
	// response.
	ClaimCompleted
	// ClaimInFlight: another owner holds a live lease.
	ClaimInFlight
	// ClaimMismatch: the key is in use with another fingerprint.
	ClaimMismatch
)

func (o ClaimOutcome) String() string {
	switch o {
	case ClaimAcquired:
		return "acquired"
	case ClaimCompleted:
		return "completed"
	case ClaimInFlight:
		return "in_flight"
	case ClaimMismatch:
		return "mismatch"
	}
	return "unknown"
}

// ClaimResult is what Store.Claim returns.
type ClaimResult struct {
	Outcome ClaimOutcome
	// TookOver is set with ClaimAcquired when the claim replaced an
	// in-flight record whose lease had expired (a crashed or stalled owner).
	TookOver bool
	Record   Record
}

// RecordState is the state of a record.
type RecordState int

// The states of a record.
const (
	StateInFlight RecordState = iota + 1
	StateCompleted
)

// Record is a stored idempotency record as seen by a claim.
type Record struct {
	State RecordState
	// Fingerprint is the versioned fingerprint the record was claimed with.
	Fingerprint string
	// ExpiresAt is the end of the record's retention.
	ExpiresAt time.Time
	// LeaseExpiresAt is when an in-flight record's lease ends.
	LeaseExpiresAt time.Time
	// Response is the stored response of a completed record.
	Response *Response
	// Fence is the fencing token of the claim that acquired or took over
	// the record (ClaimAcquired): a number greater than every fence any
	// earlier claim of the same (scope, key) received, also across
	// releases and expiry, so that a downstream system can refuse the
	// writes of a stale owner (see idem.RequestInfo.Fence). Stores draw it from
	// one counter per store that never goes back. Claims with other
	// outcomes may leave it zero.
	Fence int64
	// Checkpoint is the record's last recovery point (see StepStore), as
	// saved by SaveCheckpoint: nil for a new record, the saved bytes for a
	// record taken over (ClaimAcquired with TookOver). Opaque to stores.
	Checkpoint []byte
}

// heldLeaseEnd is the lease end of a record held for an operator
// (SaveCheckpointParams.Hold): the Unix epoch, which no live lease can
// have and which every store's time type holds.
var heldLeaseEnd = time.Unix(0, 0).UTC()

// Held reports that the record is in flight and held for an operator: an
// operation that reconciliation gave up on (see
// ReconcileParams.MaxAttempts), whose lease ends at the Unix epoch. A
// retry with its key still takes it over and resumes it.
func (r Record) Held() bool {
	return r.State == StateInFlight && r.LeaseExpiresAt.Equal(heldLeaseEnd)
}

// Response is a stored HTTP response (or the result of a non-HTTP
// operation).
type Response struct {
	StatusCode int
	Header     http.Header
	Body       []byte
	// Unreplayable marks a response whose body was not stored because it
	// was larger than the stored-response limit or the handler streamed it
	// (Flush, Hijack). The operation completed; a retry receives 409
	// idempotency.response_unavailable with the original status, never a
	// second execution.
	Unreplayable bool
}

// TxStore is implemented by stores that can complete a record in the same
// database transaction as the operation's business writes (sqlitestore,
// pgstore). The middleware and the Executor then give the operation a
// transaction through its context (see TxFromContext) and commit the
// business writes, the owner-token check and the stored response together,
// before the response is sent: after a crash either both exist or neither.
type TxStore interface {
	Store
	// BeginTx starts a transaction. It is called lazily, when the operation
	// first asks for its transaction, so that work done before that holds
	// no database lock.
	BeginTx(ctx context.Context) (Tx, error)
}

// Tx is a transaction begun by a TxStore.
type Tx interface {
	// Complete is Store.Complete inside the transaction. It returns
	// ErrLeaseLost when Token no longer owns the record, in which case the
	// caller rolls back.
	Complete(ctx context.Context, p CompleteParams) error
	// Commit commits the transaction.
	Commit(ctx context.Context) error
	// Rollback aborts the transaction; after Commit it does nothing.
	Rollback(ctx context.Context) error
	// Native returns the backend's transaction handle (*sql.Tx, pgx.Tx),
	// which the store's package exposes with its own typed accessor.
	Native() any
}

// TxClaimer is an optional TxStore capability, used with Config.ClaimInTx:
// the claim of a new key is written inside the transaction that then holds
// the operation's writes and its stored response, so that a first
// execution commits once instead of twice (sqlitestore, pgstore).
type TxClaimer interface {
	TxStore

	// ClaimTx answers as Claim does, except when the claim must insert a
	// record (the key is absent, or its record expired): it then begins a
	// transaction, writes the in-flight record owned by p.Token in it and
	// returns ClaimAcquired with that transaction open. The caller runs
	// the operation in it and ends it with Tx.Complete and Commit,
	// or with Rollback, which leaves the key as it was before the claim.
	//
	// Until the transaction ends no other claim sees the record: a
	// concurrent claim of the same key waits for it at most a bound the
	// store documents, and then answers ClaimInFlight, or answers from
	// what the transaction committed. Nobody can take an uncommitted claim
	// over, so the record needs no lease renewal while the transaction is
	// open; a crash rolls the claim back with everything else.
	//
	// A claim that rolls back leaves nothing behind, its fence included: a
	// store may hand the same fence to a later claim of the key (sqlitestore
	// draws it from a counter in the same transaction), which is safe only
	// because the operation's effects rolled back with it.
	//
	// A take-over of an in-flight record whose lease expired commits as
	// Claim does and returns ClaimAcquired with TookOver and a nil
	// Tx: the new owner may resume a multi-step operation, which
	// needs a committed claim. Every outcome other than ClaimAcquired, and
	// every error, returns a nil Tx.
	//
	// The transaction is bound to ctx as BeginTx's is: the core passes a
	// context that outlives the transaction, and cancels it if ClaimTx has
	// not returned within Config.StoreTimeout.
	ClaimTx(ctx context.Context, p ClaimParams) (ClaimResult, Tx, error)
}

// TxRenewer is implemented by a Tx that must renew the lease through
// the open transaction, because the store serialises writers and a renewal
// on another connection would wait for this transaction (SQLite). While a
// transaction that implements it is open, the core renews through it.
type TxRenewer interface {
	Renew(ctx context.Context, p RenewParams) error
}

// Watcher is an optional Store capability for wait mode: Watch returns a
// channel that is closed when the record at (scope, key) may have left the
// in-flight state (completed, released or taken over), and at once if it is
// not in flight when Watch is called. Spurious wake-ups are allowed; the
// waiter claims again to learn the state. The registration ends when ctx
// ends. Without a Watcher, waiters poll the store with exponential back-off.
type Watcher interface {
	Watch(ctx context.Context, scope, key string) (<-chan struct{}, error)
}

// StepStore is an optional Store capability: recovery points for
// multi-step operations (see Step). A record in flight may hold a
// checkpoint, opaque bytes the core writes; a claim that takes the record
// over returns it in Record.Checkpoint, so the new owner resumes after the
// last committed step. With Config.Encryption the core hands stores sealed
// checkpoints (binary, not JSON): a store keeps any bytes exactly as given.
// memstore, sqlitestore and pgstore implement it.
type StepStore interface {
	Store

	// SaveCheckpoint replaces the checkpoint of the in-flight record owned
	// by Token with Checkpoint. With EndLease it also ends the lease at
	// Now: the record stays in flight with its checkpoint but owned by no
	// live lease, so the next claim with the same fingerprint takes it
	// over at once. It returns ErrLeaseLost, changing nothing, if Token
	// does not own an in-flight record at (Scope, Key): a stale owner
	// cannot commit a step. Complete (and Tx.Complete) discards the
	// record's checkpoint: a completed record holds none.
	SaveCheckpoint(ctx context.Context, p SaveCheckpointParams) error

	// Stuck returns at most Limit unexpired in-flight records that hold a
	// checkpoint and whose lease ended at or before Now, except those held
	// for an operator (SaveCheckpointParams.Hold): operations that stopped
	// after a recovery point and that nobody is running. With Held it
	// returns the held records instead. The order is the lease's end,
	// oldest first. It changes nothing.
	Stuck(ctx context.Context, p StuckParams) ([]StuckRecord, error)
}

// CheckpointTx is implemented by the Tx of a transactional StepStore:
// SaveCheckpoint inside the transaction, so that a step's business writes
// and its recovery point commit together (or neither).
type CheckpointTx interface {
	SaveCheckpoint(ctx context.Context, p SaveCheckpointParams) error
}

// SaveCheckpointParams are the arguments of StepStore.SaveCheckpoint.
type SaveCheckpointParams struct {
	Scope, Key, Token string
	// Checkpoint is the new recovery point; never empty.
	Checkpoint []byte
	// EndLease ends the lease at Now (see StepStore.SaveCheckpoint).
	EndLease bool
	// Hold, with or without EndLease, ends the lease at the Unix epoch
	// instead (time.Unix(0, 0)): the record is held for an operator (see
	// Record.Held). It stays in flight with its checkpoint, and a claim
	// with the same fingerprint takes it over at once, as after EndLease,
	// but Stuck returns it only with StuckParams.Held. A take-over gives
	// it a live lease as to any record; a later SaveCheckpoint without
	// Hold leaves it no longer held.
	Hold bool
	Now  time.Time
}

// StuckParams are the arguments of StepStore.Stuck.
type StuckParams struct {
	// Limit bounds the records returned; it must be positive.
	Limit int
	// Held selects the records held for an operator instead of the stuck
	// ones.
	Held bool
	Now  time.Time
}

// StuckRecord is an in-flight record with a checkpoint and no live lease.
type StuckRecord struct {
	Scope, Key, Fingerprint string
	Checkpoint              []byte
	LeaseExpiresAt          time.Time
}
