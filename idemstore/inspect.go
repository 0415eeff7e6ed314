package idemstore

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Errors of the Inspector capability.
var (
	// ErrNotFound is returned by Inspector.Get and Inspector.Delete when no
	// unexpired record exists at (scope, key), or at the ID given.
	ErrNotFound = errors.New("idem: no such record")

	// ErrInvalidCursor is returned (wrapped, with the reason) by
	// Inspector.List for a ListParams.After that is not a cursor this store
	// made, or no longer one it can continue from.
	ErrInvalidCursor = errors.New("idem: invalid list cursor")

	// ErrKeySearchUnsupported is returned by Inspector.List for a
	// ListParams.Key from a store that keeps keys only hashed (redisstore):
	// it cannot tell which records hold a key. Get with the scope finds the
	// record.
	ErrKeySearchUnsupported = errors.New("idem: this store keeps keys only hashed and cannot search records by key")

	// ErrInvalidID is returned (wrapped, with the reason) by Inspector.Get
	// and Inspector.Delete for a GetParams.ID or DeleteParams.ID that does
	// not have the form of the store's record IDs, and by stores whose
	// records have no ID of their own (RecordInfo.ID is empty).
	ErrInvalidID = errors.New("idem: invalid record ID")
)

// Inspector is an optional Store capability for operators (`idem inspect`,
// `idem ls`, `idem delete`): look at records and remove one by hand. It is
// not on any request path; the middleware and the Executor never call it.
// memstore, sqlitestore, pgstore and redisstore implement it;
// storetest.Run checks it when a store does.
//
// Expired records behave as absent, as they do for Claim. Stores decide
// expiry as they do for Claim (the Now given, or their server's clock).
type Inspector interface {
	// Get returns the record at (Scope, Key), or at ID when one is given,
	// with its stored response (completed) or, on a StepStore, its
	// checkpoint (in flight: the bytes SaveCheckpoint last stored, nil if
	// none), or ErrNotFound. Both are what the store holds: sealed with
	// Config.Encryption (see Encryption.Open and Encryption.OpenCheckpoint).
	// A malformed ID, or any ID on a store whose records have none, is an
	// error wrapping ErrInvalidID.
	Get(ctx context.Context, p GetParams) (RecordInfo, error)

	// List returns one page of unexpired records, without their responses
	// (RecordInfo.Response is nil; ResponseSize is set): at most Limit
	// records, and the cursor that continues after them. With a State,
	// only records in that state; with a Key, only records with that key,
	// in any scope (a store that keeps keys only hashed returns
	// ErrKeySearchUnsupported).
	//
	// A walk starts with an empty After and passes each page's Next as the
	// next After (with the same State and Key) until Next is empty. A page
	// may hold fewer than Limit records, even none, while Next is not
	// empty: only an empty Next ends the walk. A page costs the store about
	// Limit records of memory and work, whatever the size of the store:
	// a store never sorts or holds all of its records to answer one.
	//
	// Ordered stores (memstore, sqlitestore, pgstore) walk in (Scope, Key)
	// order, in the store's collation (bytes for memstore and
	// sqlitestore, the database's for pgstore), and the cursor is the last
	// record's position (ListCursor): a walk lists every record that lives
	// and matches for the whole walk exactly once; records created or
	// deleted during the walk are listed at most once. A store that walks
	// its backend's own scan (redisstore: SCAN) lists such records at least
	// once, in the backend's order, and may list one twice when the backend
	// resizes its table during the walk (the store's documentation says
	// so).
	//
	// A cursor is printable ASCII without spaces (safe to show an operator
	// and pass back on a command line) and stays valid in other processes
	// on the same store. An After the store did not make, or can no longer
	// continue from, is an error wrapping ErrInvalidCursor.
	List(ctx context.Context, p ListParams) (ListPage, error)

	// Delete deletes the record at (Scope, Key), or at ID when one is
	// given, in one atomic step. It returns ErrNotFound if there is none,
	// ErrInvalidID as Get does, and ErrInFlight (deleting nothing) for an
	// in-flight record unless Force is set. Deleting a completed record
	// makes its key new again: a retry executes the operation a second
	// time. Deleting an in-flight record lets a retry run while the first
	// attempt may still be running; its owner then loses its lease
	// (ErrLeaseLost) when it completes.
	Delete(ctx context.Context, p DeleteParams) error
}

// GetParams are the arguments of Inspector.Get.
type GetParams struct {
	Scope, Key string
	// ID, if set, names the record by the store's own name for it
	// (RecordInfo.ID, as List returns it) instead of Scope and Key, for
	// stores that keep scopes and keys only hashed. The RecordInfo returned
	// then has an empty Scope and Key.
	ID  string
	Now time.Time
}

// ListParams are the arguments of Inspector.List.
type ListParams struct {
	// State, if set, selects records in that state only.
	State RecordState
	// Key, if set, selects records with this key (in any scope).
	Key string
	// After continues a walk: the ListPage.Next of the page before. Empty
	// starts at the beginning.
	After string
	// Limit bounds the records of the page. It must be positive.
	Limit int
	Now   time.Time
}

// ListPage is one page of Inspector.List.
type ListPage struct {
	// Records are the page's records, without their responses.
	Records []RecordInfo
	// Next continues the walk (as ListParams.After); empty when the walk
	// is complete.
	Next string
}

// DeleteParams are the arguments of Inspector.Delete.
type DeleteParams struct {
	Scope, Key string
	// ID, if set, names the record as GetParams.ID does.
	ID string
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
func (r RecordInfo) FingerprintVersion() string {
	v, _, _ := strings.Cut(r.Fingerprint, ":")
	return v
}

func (s RecordState) String() string {
	switch s {
	case StateInFlight:
		return "in-flight"
	case StateCompleted:
		return "completed"
	}
	return "unknown"
}

// ListCursor returns the List cursor that continues after the record at
// (scope, key), for stores that list in (Scope, Key) order: "k1." and the
// unpadded base64url encoding of the scope's length (a uvarint), the scope
// and the key. ParseListCursor reads it back.
func ListCursor(scope, key string) string {
	b := binary.AppendUvarint(make([]byte, 0, binary.MaxVarintLen64+len(scope)+len(key)), uint64(len(scope)))
	b = append(append(b, scope...), key...)
	return listCursorPrefix + base64.RawURLEncoding.EncodeToString(b)
}

const listCursorPrefix = "k1."

// ParseListCursor returns the (scope, key) a ListCursor names, or an error
// wrapping ErrInvalidCursor.
func ParseListCursor(cursor string) (scope, key string, err error) {
	rest, ok := strings.CutPrefix(cursor, listCursorPrefix)
	if !ok {
		return "", "", fmt.Errorf("%w: it does not start with %q", ErrInvalidCursor, listCursorPrefix)
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(rest)
	if err != nil {
		return "", "", fmt.Errorf("%w: %v", ErrInvalidCursor, err)
	}
	n, size := binary.Uvarint(b)
	if size <= 0 || n > uint64(len(b)-size) {
		return "", "", fmt.Errorf("%w: the scope's length is malformed", ErrInvalidCursor)
	}
	b = b[size:]
	scope, key = string(b[:n]), string(b[n:])
	if ListCursor(scope, key) != cursor { // an overlong length: one position, one cursor
		return "", "", fmt.Errorf("%w: the scope's length is not in its shortest form", ErrInvalidCursor)
	}
	return scope, key, nil
}
