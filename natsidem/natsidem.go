// Package natsidem connects idem's outbox and inbox to NATS JetStream
// (github.com/nats-io/nats.go/jetstream).
//
// Publisher is an outbox.Publisher: it publishes each message with its id
// as the Nats-Msg-Id header, so that JetStream drops a re-published copy
// within the stream's duplicate window (two minutes by default), and
// reports a message sent only when the stream acknowledged it (PubAck).
//
// Consume feeds a durable pull consumer's messages to an inbox.Inbox and
// acknowledges each only after the handler's writes and the inbox record
// committed; a redelivered message is acknowledged without running the
// handler again.
package natsidem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/outbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Publisher publishes outbox messages to JetStream.
type Publisher struct {
	js jetstream.JetStream
}

var _ outbox.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher on js, which the caller owns. Give js a
// publish-async timeout (jetstream.WithPublishAsyncTimeout) so that the
// futures of messages sent while the server was away are cleaned up.
func NewPublisher(js jetstream.JetStream) *Publisher {
	return &Publisher{js: js}
}

// Publish implements outbox.Publisher: it sends msgs asynchronously, in
// order, on the connection, then waits for each acknowledgement until ctx
// ends.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	failed := false
	for i, m := range msgs {
		nm := nats.NewMsg(m.Topic)
		nm.Data = m.Payload
		for k, v := range m.Headers {
			nm.Header.Set(k, v)
		}
		f, err := p.js.PublishMsgAsync(nm, jetstream.WithMsgID(m.ID))
		if err != nil {
			errs[i], failed = err, true
			continue
		}
		futures[i] = f
	}
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			errs[i], failed = err, true
		case <-ctx.Done():
			errs[i], failed = fmt.Errorf("natsidem: no acknowledgement: %w", context.Cause(ctx)), true
		}
	}
	if !failed {
		return nil
	}
	return errs
}

// StreamFor returns the stream name and subject filter that EnsureStream
// creates for subject: the stream takes every subject under the subject's
// first token ("idem.payments.created" → stream "IDEM" for "idem.>").
func StreamFor(subject string) (name, filter string) {
	first, _, _ := strings.Cut(subject, ".")
	return strings.ToUpper(sanitize(first)), first + ".>"
}

// ConsumerFor returns the durable consumer name for subject: the subject
// with dots as underscores (durable names cannot contain dots).
func ConsumerFor(subject string) string {
	return sanitize(subject)
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

// EnsureStream returns the stream StreamFor(subject) names, creating it
// (file storage, limits retention, the default two-minute duplicate window)
// when it does not exist. An existing stream is used as it is.
func EnsureStream(ctx context.Context, js jetstream.JetStream, subject string) (jetstream.Stream, error) {
	name, filter := StreamFor(subject)
	s, err := js.Stream(ctx, name)
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("natsidem: stream %s: %w", name, err)
	}
	s, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{filter}, Storage: jetstream.FileStorage})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		s, err = js.Stream(ctx, name) // created meanwhile by another process
	}
	if err != nil {
		return nil, fmt.Errorf("natsidem: create stream %s for %s: %w", name, filter, err)
	}
	return s, nil
}

// EnsureConsumer creates or updates the durable pull consumer
// ConsumerFor(subject) on the stream for subject, with explicit
// acknowledgement: a message not acknowledged within ackWait (30 seconds
// if zero) is delivered again.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, subject string, ackWait time.Duration) (jetstream.Consumer, error) {
	s, err := EnsureStream(ctx, js, subject)
	if err != nil {
		return nil, err
	}
	if ackWait == 0 {
		ackWait = 30 * time.Second
	}
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       ConsumerFor(subject),
		FilterSubject: subject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("natsidem: consumer %s: %w", ConsumerFor(subject), err)
	}
	return c, nil
}

// ConsumeConfig configures Consume. A nil *ConsumeConfig means all
// defaults.
type ConsumeConfig struct {
	// RetryDelay is how long JetStream waits before redelivering a message
	// whose handling failed. Defaults to one second.
	RetryDelay time.Duration
	// Prefetch is how many messages the client buffers. Defaults to 100.
	Prefetch int
	// PullExpiry is how long one pull request waits on the server. It also
	// bounds how long the pull requests of a consumer process that died
	// keep taking messages (which then wait out the consumer's AckWait
	// before redelivery), so it is shorter than the client's 30-second
	// default. Defaults to 5 seconds.
	PullExpiry time.Duration
	// Logger receives handler failures and dropped messages. Defaults to
	// discarding.
	Logger *slog.Logger
	// OnHandled, if set, is called after each message is acknowledged,
	// with whether the handler ran (false for a redelivery it had
	// handled).
	OnHandled func(ran bool)
}

// Consume processes cons's messages through in with h until ctx ends, then
// returns nil (or the error that stopped the iterator). Each message is
// acknowledged after Inbox.Process committed it, negatively acknowledged
// with RetryDelay when it must be retried, and terminated when it can
// never be handled. The message id is the Nats-Msg-Id header, or, for a
// message published without one, the stream name and sequence (stable
// across redeliveries of that one stored message).
func Consume(ctx context.Context, cons jetstream.Consumer, in *inbox.Inbox, h inbox.Handler, cfg *ConsumeConfig) error {
	var c ConsumeConfig
	if cfg != nil {
		c = *cfg
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = time.Second
	}
	if c.Prefetch == 0 {
		c.Prefetch = 100
	}
	if c.PullExpiry == 0 {
		c.PullExpiry = 5 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(c.Prefetch), jetstream.PullExpiry(c.PullExpiry))
	if err != nil {
		return fmt.Errorf("natsidem: consume: %w", err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) {
				return fmt.Errorf("natsidem: consume: %w", err)
			}
			// Heartbeat and connection errors: the iterator recovers.
			c.Logger.Warn("natsidem: fetching messages failed", "error", err)
			continue
		}
		handle(ctx, msg, in, h, &c)
	}
}

func handle(ctx context.Context, msg jetstream.Msg, in *inbox.Inbox, h inbox.Handler, c *ConsumeConfig) {
	m := inbox.Message{ID: msg.Headers().Get(jetstream.MsgIDHeader), Topic: msg.Subject(), Payload: msg.Data()}
	if m.ID == "" {
		if md, err := msg.Metadata(); err == nil {
			m.ID = "stream:" + md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10)
		}
	}
	if hd := msg.Headers(); len(hd) > 0 {
		m.Headers = make(map[string]string, len(hd))
		for k := range hd {
			m.Headers[k] = hd.Get(k)
		}
	}
	action, replayed, err := in.Process(ctx, m, h)
	switch action {
	case inbox.Ack:
		if err := msg.Ack(); err != nil {
			// The message is redelivered after AckWait and then
			// acknowledged as a replay.
			c.Logger.Warn("natsidem: ack failed", "error", err)
		}
		if c.OnHandled != nil {
			c.OnHandled(!replayed)
		}
	case inbox.Drop:
		c.Logger.Error("natsidem: dropping a message that can never be handled", "subject", m.Topic, "error", err)
		_ = msg.TermWithReason(err.Error())
	default:
		if ctx.Err() == nil {
			c.Logger.Warn("natsidem: handling failed; the message will be redelivered", "subject", m.Topic, "error", err)
		}
		_ = msg.NakWithDelay(c.RetryDelay)
	}
}
