// Package payments is the demo service behind `idem serve`: a small,
// retry-safe payments API whose POST is protected by the idem middleware.
//
// Payments live in the same database as the idempotency records when the
// records store is transactional (SQLite, PostgreSQL): the payment row and
// the stored response then commit in one transaction. With records kept
// elsewhere (Redis), each payment row carries the tenant and idempotency key
// under a unique constraint, so that even a re-execution after a crash (the
// lease-and-fencing guarantee's one gap) returns the existing payment
// instead of creating a second one.
package payments

import (
	"context"
	"crypto/rand"
	"errors"
	"strings"
	"time"
)

// Payment is a stored payment.
type Payment struct {
	ID          string    `json:"id"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
	Reference   string    `json:"reference"`
	CreatedAt   time.Time `json:"createdAt"`

	tenant, key string
}

// ErrNotFound is returned by Repo.Get for an unknown payment, or another
// tenant's.
var ErrNotFound = errors.New("payments: not found")

// Repo stores payments. Insert runs inside the idempotent execution whose
// context it receives: on a transactional records store it writes through
// the execution's transaction.
type Repo interface {
	// Migrate creates the payments table.
	Migrate(ctx context.Context) error
	// Insert stores p, or returns the payment already stored for the same
	// tenant and idempotency key.
	Insert(ctx context.Context, p Payment) (Payment, error)
	// Get returns the tenant's payment id.
	Get(ctx context.Context, tenant, id string) (Payment, error)
	// Count returns the number of payments of all tenants.
	Count(ctx context.Context) (int64, error)
}

// RejectedError is returned by Repo.Insert when the database refuses the
// payment's data as invalid (a constraint or a value it cannot store), as
// opposed to being unavailable: the request is answered 422 and that
// answer is stored, since a retry would be refused the same way.
type RejectedError struct {
	// Reason says what was refused, without the data itself.
	Reason string
	Err    error
}

func (e *RejectedError) Error() string {
	return "payments: rejected: " + e.Reason + ": " + e.Err.Error()
}

func (e *RejectedError) Unwrap() error { return e.Err }

// newID returns a new payment id: "pay_", the creation time in
// milliseconds as 10 digits of base 32, then 16 random characters (80
// bits). The digits are the API's characters in ASCII order, so ids sort
// by creation time: a new payment's row goes to the right edge of the
// payments table's B-tree (on SQLite a WITHOUT ROWID table ordered by id)
// instead of into a random page, which splits pages less often (5.65 ->
// 5.37 WAL frames per first payment, TestSQLiteFramesPerPayment).
func newID() string { return newIDAt(time.Now()) }

// newIDAt is newID for a payment created at now.
func newIDAt(now time.Time) string {
	const digits = "234567abcdefghijklmnopqrstuvwxyz" // a-z and 2-7, in ASCII order
	const prefix, timeLen = "pay_", 10
	var b [len(prefix) + 26]byte
	copy(b[:], prefix)
	ms := uint64(now.UnixMilli())
	for i := len(prefix) + timeLen - 1; i >= len(prefix); i-- {
		b[i] = digits[ms&31]
		ms >>= 5
	}
	random := rand.Text() // 26 characters of A-Z and 2-7
	for i := len(prefix) + timeLen; i < len(b); i++ {
		c := random[i-len(prefix)-timeLen]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		b[i] = c
	}
	return string(b[:])
}

// ValidPaymentID reports whether s is a payment id as the API makes them:
// "pay_" and 26 characters of lower-case base32 (a-z, 2-7).
func ValidPaymentID(s string) bool {
	b, ok := strings.CutPrefix(s, "pay_")
	return ok && len(b) == 26 && strings.Trim(b, "abcdefghijklmnopqrstuvwxyz234567") == ""
}

// createTable is the payments table's DDL, the same on every database but
// for the types of the amount and of the creation time. The unique index
// on (tenant, idempotency_key) is not part of it: only payments whose
// records are kept elsewhere need it (keyIndexName).
func createTable(integer, timestamp string) string {
	return `CREATE TABLE IF NOT EXISTS payments (
		id              TEXT PRIMARY KEY,
		tenant          TEXT NOT NULL,
		idempotency_key TEXT NOT NULL,
		amount_cents    ` + integer + ` NOT NULL,
		currency        TEXT NOT NULL,
		reference       TEXT NOT NULL,
		created_at      ` + timestamp + ` NOT NULL
	)`
}

// keyIndexName names the unique index on (tenant, idempotency_key) that
// Migrate creates for a repo without SameTx (records elsewhere, or the
// provider flow's steps), and drops for one with it. Tables created before
// it had the same uniqueness as a table constraint, which Migrate removes
// the same way.
//
// With the records in the same transaction, a payment and its completed
// record commit together or not at all: a retry finds the record and
// replays, and a re-execution (after a crash, or a released key) finds no
// payment, because the earlier one rolled back with its claim. The index
// would only cost every payment a write in a B-tree ordered by a random
// key. With records in Redis, a re-execution after a crash can follow a
// committed payment whose record was never completed; the index is then
// what makes it return that payment instead of a second one.
const keyIndexName = "payments_tenant_key"

// errDuplicateKeys is the reason Migrate gives when it cannot create the
// unique index: payments made while the records shared their transaction,
// whose keys were used again after their records expired.
const errDuplicateKeys = "two payments share a tenant and idempotency key (a key used again after its record expired, " +
	"while the records were kept in this database), so the unique index that records kept elsewhere need cannot be created"
