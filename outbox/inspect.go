package outbox

import (
	"context"
	"errors"
	"time"
)

// ErrNotPending is returned by Inspector.GetPending and Inspector.RetryNow
// when no unsent message has the sequence number given: it was sent (or
// never existed).
var ErrNotPending = errors.New("outbox: no unsent message with this sequence number")

// MaxListLimit bounds Inspector.ListPending's limit.
const MaxListLimit = 1000

// Inspector is an optional Store capability for operators (idem console):
// look at the messages not yet sent and make one claimable now. It is not
// on any dispatcher's path. sqliteoutbox and pgoutbox implement it.
type Inspector interface {
	// Backlog returns how many messages are not sent yet and the oldest of
	// them (nil when there is none), without its payload.
	Backlog(ctx context.Context) (int64, *PendingMessage, error)

	// ListPending returns at most Limit unsent messages with a sequence
	// number above After, in sequence order, with their payloads only if
	// WithPayload is set. Limit must be between 1 and MaxListLimit.
	ListPending(ctx context.Context, p ListPendingParams) ([]PendingMessage, error)

	// GetPending returns the unsent message with sequence number seq,
	// with its payload, or ErrNotPending.
	GetPending(ctx context.Context, seq int64) (PendingMessage, error)

	// RetryNow ends any claim on the unsent message seq, so that the next
	// dispatcher poll publishes it, and returns ErrNotPending if it is
	// sent. A dispatcher that holds the claim and is publishing it right
	// now may still publish it too: the message then goes out twice with
	// the same ID, which brokers that deduplicate (JetStream) and
	// consumers (the inbox) absorb, as after any dispatcher crash.
	RetryNow(ctx context.Context, seq int64) error
}

// ListPendingParams are the arguments of Inspector.ListPending.
type ListPendingParams struct {
	// After is the sequence number to list after (0: from the oldest).
	After int64
	// Limit bounds the messages returned.
	Limit int
	// WithPayload includes the messages' payloads and headers.
	WithPayload bool
}

// PendingMessage is an unsent message as an operator sees it.
type PendingMessage struct {
	Message
	// Size is the payload's size in bytes (also when Payload is omitted).
	Size int
	// CreatedAt is when the message was added.
	CreatedAt time.Time
	// Attempts counts the claims that took the message to publish it.
	Attempts int
	// ClaimedUntil is the end of the current claim's lease (zero when no
	// dispatcher holds it). A claim that ended is no claim.
	ClaimedUntil time.Time
}

// CheckListLimit validates ListPendingParams.Limit for the stores.
func CheckListLimit(limit int) error {
	if limit <= 0 || limit > MaxListLimit {
		return errors.New("outbox: ListPending needs a limit between 1 and 1000")
	}
	return nil
}
