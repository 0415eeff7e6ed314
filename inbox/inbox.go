// Package inbox deduplicates message consumers: it runs a handler at most
// once per message id, through an idem.Executor and its store, and tells
// the broker adapter when to acknowledge.
//
// Brokers deliver at least once: a consumer that crashes before it
// acknowledges, a lost acknowledgement, or a publisher that sends a message
// twice (an outbox dispatcher that died before marking it sent) all lead
// to a redelivery. The inbox turns that into exactly-once effects:
//
//   - the message id is the idempotency key (scope: the inbox's name and
//     the message's topic), and the payload is the fingerprint;
//   - on a transactional store (sqlitestore, pgstore) the handler writes
//     through the execution's transaction (sqlitestore.Tx, pgstore.Tx), so
//     its writes and the inbox record commit together;
//   - Process returns only after that commit, and the adapter acknowledges
//     only then; a crash before it leaves the message unacknowledged, and
//     its redelivery runs the handler again only if nothing was committed;
//   - a redelivered message whose record exists is acknowledged without
//     running the handler.
//
// The record's retention (the Executor's Config.TTL) is the deduplication
// window: it must be longer than the broker can redeliver a message
// (consumer acknowledgement deadline times delivery attempts, or the
// queue's message TTL).
//
// idemnats and idemamqp connect an Inbox to NATS JetStream and RabbitMQ.
package inbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemhq/idem"
)

// Message is a delivered message as the handler sees it.
type Message struct {
	// ID is the publisher's message id (Nats-Msg-Id, AMQP message-id):
	// the deduplication key.
	ID string
	// Topic is the subject or routing key the message was published to.
	Topic string
	// Payload is the message body.
	Payload []byte
	// Headers are the message's headers (first value of each).
	Headers map[string]string
}

// Handler handles one message. Its context carries the execution's
// transaction on a transactional store: write through it, and do not
// commit it. Returning an error rolls the writes back and asks the broker
// to deliver the message again, unless it wraps ErrUnprocessable.
type Handler func(ctx context.Context, m Message) error

// Action is what the adapter does with the delivery after Process.
type Action int

// The actions.
const (
	// Ack: the message is handled (now or by an earlier delivery);
	// acknowledge it.
	Ack Action = iota + 1
	// Retry: the message was not handled (the handler failed, the store
	// was unavailable, or another consumer is handling the same id right
	// now); ask for a redelivery after a delay.
	Retry
	// Drop: the message can never be handled (no id, an id already used
	// by a different payload, or the handler said ErrUnprocessable);
	// terminate or reject it so that it is not redelivered forever, and log
	// the error.
	Drop
)

func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case Retry:
		return "retry"
	case Drop:
		return "drop"
	}
	return "unknown"
}

// ErrNoID is returned (with Drop) for a message without an id: without one
// it cannot be deduplicated.
var ErrNoID = errors.New("inbox: message has no id")

// ErrUnprocessable marks a handler error as permanent: a handler returns an
// error wrapping it for a message it can never handle (a payload it cannot
// parse), and Process answers Drop instead of Retry, so that a poison
// message is not redelivered forever. The handler's writes still roll back.
var ErrUnprocessable = errors.New("inbox: message cannot be processed")

// Config configures an Inbox.
type Config struct {
	// Name names the consumer: records are scoped by it, so that two
	// consumers of one message (two services, two queues) each handle it
	// once. Required.
	Name string
}

// Inbox runs handlers at most once per message id.
type Inbox struct {
	exec *idem.Executor
	name string
}

// New returns an Inbox that records handled messages through exec.
func New(exec *idem.Executor, cfg Config) (*Inbox, error) {
	if exec == nil {
		return nil, errors.New("inbox: nil executor")
	}
	if cfg.Name == "" {
		return nil, errors.New("inbox: Config.Name is required")
	}
	return &Inbox{exec: exec, name: cfg.Name}, nil
}

// Process runs h for m unless m.ID was already handled, and returns what
// to do with the delivery: Ack (with a nil error, whether h ran now or an
// earlier delivery committed it), Retry or Drop (with the reason).
// Replayed reports that h did not run because the id was already handled.
func (in *Inbox) Process(ctx context.Context, m Message, h Handler) (a Action, replayed bool, err error) {
	if m.ID == "" {
		return Drop, false, ErrNoID
	}
	if !validID(m.ID) {
		return Drop, false, fmt.Errorf("inbox: message id is not 1 to %d printable ASCII bytes", idem.MaxKeyLength)
	}
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "CONSUME", Operation: m.Topic, Body: m.Payload, Payload: true})
	if err != nil {
		return Drop, false, fmt.Errorf("inbox: fingerprint: %w", err)
	}
	res, err := in.exec.Do(ctx, idem.DoParams{
		Scope:       idem.Scope(in.name, m.Topic),
		Key:         m.ID,
		Fingerprint: fp,
		Operation:   "consume " + m.Topic,
	}, func(ctx context.Context) (*idem.Response, error) {
		if err := h(ctx, m); err != nil {
			return nil, err
		}
		return &idem.Response{StatusCode: http.StatusOK}, nil
	})
	switch {
	case err == nil:
		return Ack, res.Replayed, nil
	case errors.Is(err, idem.ErrFingerprintMismatch):
		return Drop, false, fmt.Errorf("inbox: message id %q was already handled with another payload: %w", m.ID, err)
	case errors.Is(err, idem.ErrResponseUnavailable):
		// Completed earlier; only its (empty) response is missing.
		return Ack, true, nil
	case errors.Is(err, ErrUnprocessable):
		return Drop, false, err
	}
	return Retry, false, err
}

// validID reports whether id can be an idempotency key.
func validID(id string) bool {
	if len(id) > idem.MaxKeyLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}
