// Package outbox is a transactional outbox: messages an operation adds
// inside its database transaction commit with its business rows (and, under
// idem, with the stored response), or not at all; a Dispatcher then
// publishes the committed messages to a broker, at least once.
//
// The package holds the broker- and database-independent parts: Message,
// the Store a database backend implements (sqliteoutbox, pgoutbox), the
// Publisher a broker adapter implements (idemnats, idemamqp), and the
// Dispatcher that moves messages from one to the other. It depends on the
// standard library only, so a user downloads only the drivers they use.
//
// # Guarantees
//
//   - A message is published only if the transaction that added it
//     committed.
//   - Every committed message is published at least once: it is marked sent
//     only after the broker acknowledged storing it. A dispatcher that dies
//     between the acknowledgement and the mark leaves the message to be
//     published again, with the same ID; brokers that deduplicate by id
//     (JetStream's Nats-Msg-Id) drop that copy within their window, and
//     consumers deduplicate the rest (see the inbox package).
//   - Messages with the same non-empty Key are published one after another
//     in the order they were added (their sequence number); a message is
//     never published before an earlier message of its key was
//     acknowledged. Messages with an empty Key are unordered.
//   - Several dispatchers may share one outbox: each claims rows under a
//     lease before publishing them, so in a run without faults each message
//     is published once. A dispatcher that dies leaves its claims to expire;
//     another then publishes them.
package outbox

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Limits on a message, checked by Validate (and by the stores' Add).
const (
	// MaxIDLength bounds Message.ID. Message ids become idempotency keys
	// at the consumer, whose limit is the same.
	MaxIDLength = 255
	// MaxTopicLength bounds Message.Topic.
	MaxTopicLength = 255
	// MaxKeyLength bounds Message.Key.
	MaxKeyLength = 255
	// DefaultMaxPayload bounds Message.Payload: NATS servers refuse
	// messages over 1 MiB by default.
	DefaultMaxPayload = 1 << 20
	// MaxHeaders bounds the number of Message.Headers.
	MaxHeaders = 64
)

// Message is one message in the outbox.
type Message struct {
	// ID identifies the message for its whole life: it is stable across
	// re-publications and is what brokers and consumers deduplicate on
	// (Nats-Msg-Id on JetStream, message-id on AMQP). Printable ASCII, at
	// most MaxIDLength bytes. Add generates a random one when it is empty;
	// derive it from the business event ("payment.created:pay_123") when
	// the same event may be added twice, so that the outbox keeps it once.
	ID string
	// Topic is where the message goes: the NATS subject, or the AMQP
	// routing key. Required.
	Topic string
	// Key orders messages: those with the same non-empty Key are published
	// in the order they were added. Empty means unordered.
	Key string
	// Payload is the message body, at most DefaultMaxPayload bytes.
	Payload []byte
	// Headers are sent as message headers (NATS headers, AMQP headers
	// table). At most MaxHeaders.
	Headers map[string]string

	// Seq is the outbox's sequence number, set by the store on messages
	// returned by Claim. It is ignored by Add.
	Seq int64
}

// ErrInvalidMessage is wrapped by the error for a message Validate refuses.
var ErrInvalidMessage = errors.New("outbox: invalid message")

// Prepare fills a missing ID with a new random one and validates m; stores
// call it in Add.
func Prepare(m *Message) error {
	if m.ID == "" {
		m.ID = NewID()
	}
	return Validate(*m)
}

// Validate reports whether m can be added to an outbox.
func Validate(m Message) error {
	switch {
	case m.ID == "" || len(m.ID) > MaxIDLength || !printable(m.ID):
		return fmt.Errorf("%w: the id must be 1 to %d printable ASCII bytes", ErrInvalidMessage, MaxIDLength)
	case m.Topic == "" || len(m.Topic) > MaxTopicLength || !printable(m.Topic) || strings.ContainsAny(m.Topic, " *>"):
		return fmt.Errorf("%w: the topic must be 1 to %d printable ASCII bytes without spaces or wildcards", ErrInvalidMessage, MaxTopicLength)
	case len(m.Key) > MaxKeyLength:
		return fmt.Errorf("%w: the key is over %d bytes", ErrInvalidMessage, MaxKeyLength)
	case len(m.Payload) > DefaultMaxPayload:
		return fmt.Errorf("%w: the payload is %d bytes, over %d", ErrInvalidMessage, len(m.Payload), DefaultMaxPayload)
	case len(m.Headers) > MaxHeaders:
		return fmt.Errorf("%w: %d headers, over %d", ErrInvalidMessage, len(m.Headers), MaxHeaders)
	}
	for k, v := range m.Headers {
		if k == "" || !printable(k) || strings.ContainsAny(k, ": ") || strings.ContainsAny(v, "\r\n") {
			return fmt.Errorf("%w: header %q", ErrInvalidMessage, k)
		}
	}
	return nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e {
			return false
		}
	}
	return true
}

// PrepareRow returns m as the stores insert it: prepared (Prepare), its
// payload never nil (the column is NOT NULL), and its headers encoded
// (EncodeHeaders).
func PrepareRow(m Message) (Message, string, error) {
	if err := Prepare(&m); err != nil {
		return m, "", err
	}
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	h, err := EncodeHeaders(m.Headers)
	return m, h, err
}

// NewID returns a new random message id ("msg_" and 26 base32 letters).
func NewID() string {
	return "msg_" + strings.ToLower(rand.Text())
}

// EncodeHeaders and DecodeHeaders are the stores' column form of headers
// (a JSON object, or empty for none).
func EncodeHeaders(h map[string]string) (string, error) {
	if len(h) == 0 {
		return "", nil
	}
	b, err := json.Marshal(h)
	return string(b), err
}

// DecodeHeaders reverses EncodeHeaders.
func DecodeHeaders(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, fmt.Errorf("outbox: stored headers: %w", err)
	}
	return h, nil
}

// Store is an outbox table in a database, as the Dispatcher uses it. Its
// Add (with the transaction type of its database) is the backend's own API.
//
// Every method is one atomic step, safe for concurrent use by any number of
// dispatchers in any number of processes.
type Store interface {
	// Claim takes up to Limit unsent messages that no live claim holds,
	// for Owner until its clock plus Lease, and returns them in sequence
	// order. It takes a message with a non-empty Key only if no earlier
	// unsent message of that Key is held by a live claim, so that a key's
	// messages are never published out of order by two dispatchers.
	Claim(ctx context.Context, p ClaimParams) ([]Message, error)
	// MarkSent marks the messages with the given sequence numbers sent.
	// Sent messages are never claimed again; DeleteSent removes them
	// later. Marking a message that was meanwhile claimed by another owner
	// is allowed: it was published.
	MarkSent(ctx context.Context, owner string, seqs []int64) error
	// Release ends Owner's claim on the given messages, which stay unsent
	// and become claimable at once.
	Release(ctx context.Context, owner string, seqs []int64) error
	// DeleteSent deletes at most Limit messages sent at or before Before
	// and returns how many it deleted; callers repeat it until it returns
	// fewer than Limit.
	DeleteSent(ctx context.Context, before time.Time, limit int) (int, error)
}

// ClaimParams are the arguments of Store.Claim.
type ClaimParams struct {
	// Owner is the claiming dispatcher's token.
	Owner string
	// Limit bounds the messages returned; it must be positive.
	Limit int
	// Lease is how long the claim holds the messages. A dispatcher that
	// has not marked or released them by then is presumed dead.
	Lease time.Duration
	// Now is the dispatcher's clock; stores on a database server may use
	// the server's clock instead (and document it).
	Now time.Time
}

// Publisher sends messages to a broker. idemnats and idemamqp implement it.
type Publisher interface {
	// Publish sends msgs and returns one error per message, in order: nil
	// when the broker acknowledged that it stored the message (a JetStream
	// PubAck, an AMQP publisher confirm), so that the outbox can forget
	// it. It must send a message's ID as the broker's message id. It must
	// return within ctx's deadline. A nil slice means every message was
	// acknowledged.
	Publish(ctx context.Context, msgs []Message) []error
}
