package idem

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is returned by Inspector.Get and Inspector.Delete when no
// unexpired record exists at (scope, key).
var ErrNotFound = errors.New("idem: no such record")

// Inspector is an optional Store capability for operators (`idem inspect`,
// `idem ls`, `idem delete`): look at records and remove one by hand. It is
// not on any request path; the middleware and the Executor never call it.
// memstore, sqlitestore, pgstore and redisstore implement it;
// storetest.Run checks it when a store does.
//
// Expired records behave as absent, as they do for Claim. Stores decide
// expiry as they do for Claim (the Now given, or their server's clock).
type Inspector interface {
	// Get returns the record at (Scope, Key), with its stored response
	// (completed) or, on a StepStore, its checkpoint (in flight: the bytes
	// SaveCheckpoint last stored, nil if none), or ErrNotFound. Both are
	// what the store holds: sealed with Config.Encryption (see
	// Encryption.Open and Encryption.OpenCheckpoint).
	Get(ctx context.Context, p GetParams) (RecordInfo, error)

	// List returns at most Limit unexpired records, without their
	// responses (RecordInfo.Response is nil; ResponseSize is set). With a
	// State, only records in that state; with a Key, only records with that
	// key, in any scope (a store that cannot search by key, because it
	// keeps keys only hashed, returns an error saying so). The order is the
	// store's own: sorted by (Scope, Key) where the store can, unspecified
	// otherwise.
	List(ctx context.Context, p ListParams) ([]RecordInfo, error)

	// Delete deletes the record at (Scope, Key) in one atomic step. It
	// returns ErrNotFound if there is none, and ErrInFlight (deleting
	// nothing) for an in-flight record unless Force is set. Deleting a
	// completed record makes its key new again: a retry executes the
	// operation a second time. Deleting an in-flight record lets a retry
	// run while the first attempt may still be running; its owner then
	// loses its lease (ErrLeaseLost) when it completes.
	Delete(ctx context.Context, p DeleteParams) error
}

// GetParams are the arguments of Inspector.Get.
type GetParams struct {
	Scope, Key string
	Now        time.Time
}

// ListParams are the arguments of Inspector.List.
type ListParams struct {
	// State, if set, selects records in that state only.
	State RecordState
	// Key, if set, selects records with this key (in any scope).
	Key string
	// Limit bounds the records returned. It must be positive.
	Limit int
	Now   time.Time
}

// DeleteParams are the arguments of Inspector.Delete.
type DeleteParams struct {
	Scope, Key string
	// Force deletes an in-flight record too.
	Force bool
	Now   time.Time
}

// RecordInfo is a record as an operator sees it.
type RecordInfo struct {
	// Scope and Key identify the record. A store that keeps them only
	// hashed (redisstore) leaves them empty in List's results; Get echoes
	// the ones it was given.
	Scope, Key string
	// ID is the store's own name for the record where it has one (the
	// Redis key), for operators who look at the backend directly.
	ID string
	// Record holds the state, fingerprint, retention, lease (in flight)
	// and, from Get, the stored response (completed) or checkpoint (in
	// flight).
	Record
	// ResponseSize is the size in bytes of the stored, encoded response
	// (status, header fields and body); 0 while in flight.
	ResponseSize int
}

// FingerprintVersion returns the encoding version of the record's
// fingerprint (the part before the colon, such as "v1").
func (r RecordInfo) FingerprintVersion() string { return fingerprintVersionOf(r.Fingerprint) }

func (s RecordState) String() string {
	switch s {
	case StateInFlight:
		return "in-flight"
	case StateCompleted:
		return "completed"
	}
	return "unknown"
}
