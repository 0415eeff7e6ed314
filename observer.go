package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"time"
)

// EventKind classifies what happened to one request or operation.
type EventKind int

// The kinds of Event.
const (
	// EventExecuted: the operation ran and its response was stored.
	EventExecuted EventKind = iota + 1
	// EventReplayed: a stored response was returned.
	EventReplayed
	// EventInFlight: a duplicate found the first attempt still running
	// (409).
	EventInFlight
	// EventMismatch: the key was reused with another request (422).
	EventMismatch
	// EventReleased: the operation ran but its outcome was not stored (5xx,
	// error, panic, client gone); the key can be used again.
	EventReleased
	// EventLeaseLost: the owner lost its lease; its result was discarded.
	EventLeaseLost
	// EventStoreError: the store failed; Err says how.
	EventStoreError
	// EventRejected: the request was refused before any claim (missing or
	// invalid key, invalid or oversized body, invalid scope); Code says
	// why.
	EventRejected
	// EventUnavailable: the operation had completed but its response was
	// not stored, so the retry got 409 idempotency.response_unavailable.
	EventUnavailable
	// EventRenewed: a lease was renewed while the operation ran.
	EventRenewed
	// EventSuspended: the operation ended without a stored outcome after
	// a recovery point (see Step); the record stays for the next attempt
	// to resume, instead of being released.
	EventSuspended
	// EventHeld: as EventSuspended, and the record is held for an operator
	// (ReconcileParams.MaxAttempts, MaxAge): reconciliation no longer
	// resumes it.
	EventHeld
)

var eventKindNames = [...]string{
	EventExecuted:    "executed",
	EventReplayed:    "replayed",
	EventInFlight:    "in_flight",
	EventMismatch:    "mismatch",
	EventReleased:    "released",
	EventLeaseLost:   "lease_lost",
	EventStoreError:  "store_error",
	EventRejected:    "rejected",
	EventUnavailable: "unavailable",
	EventRenewed:     "renewed",
	EventSuspended:   "suspended",
	EventHeld:        "held",
}

func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventKindNames) {
		return eventKindNames[k]
	}
	return "unknown"
}

// Event describes one outcome. Observers must not retain Err beyond the
// call if they do not need it, and must return quickly: they run on the
// request's goroutine.
type Event struct {
	Kind EventKind
	// Operation names the operation (the route pattern for the middleware).
	Operation string
	// Status is the HTTP status sent, when there is one.
	Status int
	// Code is the problem code sent, for errors and rejections.
	Code string
	// Duration is the time from the request reaching idem to this event.
	Duration time.Duration
	// TookOver is set on EventExecuted and EventReleased when the execution
	// took over a record whose previous owner's lease had expired.
	TookOver bool
	// Waited is set when the request waited (wait mode) before its outcome.
	Waited bool
	// Err is the error behind EventStoreError, EventLeaseLost and
	// EventReleased (when an error or panic caused the release).
	Err error
}

// Observer is told about every outcome, so that metrics (Prometheus,
// OpenTelemetry) can be wired without the core importing them.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// RedactKey returns the form in which idem logs an idempotency key:
// "sha256:" and the first 12 hex digits of the key's SHA-256. Equal keys
// redact alike (in every tenant and operation), so an operator can follow
// one key through the core's log lines and an access log that uses the same
// function, while the log never holds the key itself, which clients
// sometimes build from order or user identifiers.
func RedactKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:6])
}

// redactedKey defers RedactKey until a log line is actually written.
type redactedKey string

func (k redactedKey) LogValue() slog.Value { return slog.StringValue(RedactKey(string(k))) }

// keyAttr is the log attribute of an idempotency key.
func keyAttr(key string) slog.Attr {
	return slog.Any("key", redactedKey(key))
}
