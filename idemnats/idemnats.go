// Package idemnats connects idem's outbox and inbox to NATS JetStream
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
package idemnats

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
			errs[i], failed = fmt.Errorf("idemnats: no acknowledgement: %w", context.Cause(ctx)), true
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
		return nil, fmt.Errorf("idemnats: stream %s: %w", name, err)
	}
	s, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{filter}, Storage: jetstream.FileStorage})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		s, err = js.Stream(ctx, name) // created meanwhile by another process
	}
	if err != nil {
		return nil, fmt.Errorf("idemnats: create stream %s for %s: %w", name, filter, err)
	}
	return s, nil
}

// EnsureConsumer returns the durable pull consumer ConsumerFor(subject)
// on the stream for subject (created first if need be, as EnsureStream
// does), with explicit acknowledgement: a message not acknowledged within
// ackWait (30 seconds if zero) is delivered again. It is
// EnsureConsumerConfig with only AckWait set: a consumer it creates
// delivers the whole stream.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, subject string, ackWait time.Duration) (jetstream.Consumer, error) {
	return EnsureConsumerConfig(ctx, js, subject, &ConsumerConfig{AckWait: ackWait})
}

// ConsumerConfig configures EnsureConsumerConfig. A nil *ConsumerConfig
// means all defaults.
type ConsumerConfig struct {
	// AckWait is how long JetStream waits for an acknowledgement before
	// it delivers a message again. Defaults to 30 seconds.
	AckWait time.Duration
	// StartFunc, if set, is called when the consumer does not exist and
	// has to be created; it returns the publication time of the oldest
	// message the new consumer delivers (JetStream's DeliverByStartTime),
	// or the zero time for the whole stream. A consumer re-created for a
	// process that has handled messages before (its consumer was deleted,
	// or lost with the server's JetStream state) starts at its
	// deduplication window this way, instead of delivering again messages
	// whose inbox records have expired. Defaults to the whole stream.
	StartFunc func(ctx context.Context) (time.Time, error)
}

// EnsureConsumerConfig returns the durable pull consumer
// ConsumerFor(subject) on the stream for subject, creating the stream (as
// EnsureStream does) and the consumer when they do not exist. An existing
// consumer keeps its position and delivery policy; only its AckWait is
// updated to cfg's, where the server allows it: nats-server 2.9 refuses to
// update a consumer created with a start time, which then keeps its
// AckWait.
func EnsureConsumerConfig(ctx context.Context, js jetstream.JetStream, subject string, cfg *ConsumerConfig) (jetstream.Consumer, error) {
	var c ConsumerConfig
	if cfg != nil {
		c = *cfg
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	s, err := EnsureStream(ctx, js, subject)
	if err != nil {
		return nil, err
	}
	name := ConsumerFor(subject)
	cons, err := s.Consumer(ctx, name)
	switch {
	case err == nil:
		existing := cons.CachedInfo().Config
		if existing.AckWait == c.AckWait {
			return cons, nil
		}
		// The delivery policy and start of a consumer cannot be changed;
		// its acknowledgement deadline can.
		policy := existing.DeliverPolicy
		existing.AckWait = c.AckWait
		updated, err := s.UpdateConsumer(ctx, existing)
		if err != nil && policy == jetstream.DeliverByStartTimePolicy {
			// nats-server 2.9 refuses every update of a consumer with a
			// start time ("start time can not be updated"): it keeps
			// its AckWait.
			return cons, nil
		}
		if err != nil {
			return nil, fmt.Errorf("idemnats: update consumer %s: %w", name, err)
		}
		return updated, nil
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, fmt.Errorf("idemnats: consumer %s: %w", name, err)
	}
	cc := jetstream.ConsumerConfig{
		Durable:       name,
		FilterSubject: subject,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if c.StartFunc != nil {
		start, err := c.StartFunc(ctx)
		if err != nil {
			return nil, fmt.Errorf("idemnats: consumer %s: where to start: %w", name, err)
		}
		if !start.IsZero() {
			cc.DeliverPolicy, cc.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
		}
	}
	cons, err = s.CreateConsumer(ctx, cc)
	if errors.Is(err, jetstream.ErrConsumerExists) {
		cons, err = s.Consumer(ctx, name) // created meanwhile by another process
	}
	if err != nil {
		return nil, fmt.Errorf("idemnats: create consumer %s: %w", name, err)
	}
	return cons, nil
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
	// default. The server sends heartbeats every half of it, so a
	// consumer that the server no longer knows is noticed after about
	// this long. Defaults to 5 seconds.
	PullExpiry time.Duration
	// Logger receives handler failures, dropped messages and the
	// consumer's re-creation. Defaults to discarding.
	Logger *slog.Logger
	// OnHandled, if set, is called after each message is acknowledged,
	// with whether the handler ran (false for a redelivery it had
	// handled).
	OnHandled func(ran bool)
	// OnDropped, if set, is called after a message that can never be
	// handled (inbox.Drop: no usable id, an id reused with another
	// payload, or a handler error wrapping inbox.ErrUnprocessable) was
	// terminated, with the reason. Consume has logged it.
	OnDropped func(m inbox.Message, err error)
	// ConsumerFunc, if set, returns the consumer to use when the one
	// being consumed is gone: deleted, or lost with the server's
	// JetStream state (a server restarted without its store directory).
	// Consume notices it when the server reports the deletion, or when
	// heartbeats stop and the server answers that the consumer or its
	// stream does not exist; it then calls ConsumerFunc (each call
	// bounded by 10 seconds, retried with back-off up to 5 seconds until
	// it succeeds or ctx ends) and goes on with the new consumer. A
	// function calling EnsureConsumerConfig fits: it creates the stream
	// and the consumer again. Without it, Consume returns an error when
	// its consumer is gone.
	ConsumerFunc func(ctx context.Context) (jetstream.Consumer, error)
	// RecreateDelay is how long Consume waits, once its consumer is
	// gone, before it calls ConsumerFunc. The server tells a consumer's
	// clients of its deletion before it has removed the consumer's files
	// (and, when the stream is deleted, the stream's). A consumer or
	// stream created again at once under the same name shares their
	// directory: nats-server 2.9 then loads the old files or deletes the
	// new ones, and the new consumer delivers nothing, or resumes from
	// the old position and skips the new messages. Defaults to one
	// second.
	RecreateDelay time.Duration
}

// errConsumerGone reports that the consumer being consumed was deleted or
// is unknown to the server.
var errConsumerGone = errors.New("idemnats: the consumer is gone")

// Consume processes cons's messages through in with h until ctx ends, then
// returns nil (or the error that stopped it). Each message is
// acknowledged after Inbox.Process committed it, negatively acknowledged
// with RetryDelay when it must be retried, and terminated when it can
// never be handled. The message id is the Nats-Msg-Id header, or, for a
// message published without one, the stream name and sequence (stable
// across redeliveries of that one stored message). When the consumer is
// gone, Consume gets another from ConsumeConfig.ConsumerFunc, or returns
// an error without one.
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
	if c.RecreateDelay == 0 {
		c.RecreateDelay = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	for {
		err := consumeUntilGone(ctx, cons, in, h, &c)
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, errConsumerGone) || c.ConsumerFunc == nil {
			return err
		}
		c.Logger.Warn("idemnats: the consumer is gone; creating it again", "error", err, "in", c.RecreateDelay)
		if !sleep(ctx, c.RecreateDelay) {
			return nil
		}
		if cons = recreate(ctx, &c); cons == nil {
			return nil // ctx ended
		}
		c.Logger.Info("idemnats: consumer created again; consuming", "consumer", consumerName(cons))
	}
}

// consumeUntilGone consumes cons until ctx ends (nil), the consumer is
// gone (an error wrapping errConsumerGone), or the iterator fails for
// good.
func consumeUntilGone(ctx context.Context, cons jetstream.Consumer, in *inbox.Inbox, h inbox.Handler, c *ConsumeConfig) error {
	it, err := cons.Messages(jetstream.PullMaxMessages(c.Prefetch), jetstream.PullExpiry(c.PullExpiry))
	if err != nil {
		return fmt.Errorf("idemnats: consume: %w", err)
	}
	defer it.Stop()
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		switch {
		case err == nil:
			handle(ctx, msg, in, h, c)
			continue
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, jetstream.ErrConsumerDeleted):
			return fmt.Errorf("%w: %w", errConsumerGone, err)
		case errors.Is(err, jetstream.ErrMsgIteratorClosed):
			// Closed by the client after a terminal status (a deleted
			// consumer, a bad request), or with the connection.
			if errors.Is(err, jetstream.ErrConnectionClosed) {
				return fmt.Errorf("idemnats: consume: %w", err)
			}
			return fmt.Errorf("%w: %w", errConsumerGone, err)
		case errors.Is(err, jetstream.ErrNoHeartbeat):
			// Either the connection is unhealthy (the iterator recovers
			// on its own), or the server does not know the consumer any
			// more: pull requests to it are not answered at all.
			if gone := probe(ctx, cons); gone != nil {
				return fmt.Errorf("%w: %w", errConsumerGone, gone)
			}
		}
		c.Logger.Warn("idemnats: fetching messages failed", "error", err)
	}
}

// probe asks the server whether cons (and its stream) still exist. It
// returns the server's not-found answer, or nil when the consumer exists
// or the server did not answer (a connection problem, which the iterator
// recovers from).
func probe(ctx context.Context, cons jetstream.Consumer) error {
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := cons.Info(pctx)
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	return nil
}

// recreate calls c.ConsumerFunc until it succeeds, and returns nil once
// ctx ended.
func recreate(ctx context.Context, c *ConsumeConfig) jetstream.Consumer {
	backoff := 100 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		cons, err := c.ConsumerFunc(rctx)
		cancel()
		if err == nil {
			return cons
		}
		if ctx.Err() != nil {
			return nil
		}
		c.Logger.Warn("idemnats: cannot create the consumer yet; retrying", "error", err, "in", backoff)
		if !sleep(ctx, backoff) {
			return nil
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// sleep waits for d, and reports false if ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func consumerName(cons jetstream.Consumer) string {
	if info := cons.CachedInfo(); info != nil {
		return info.Stream + "/" + info.Name
	}
	return ""
}

// maxLoggedID bounds a message id in logs: ids come from publishers.
const maxLoggedID = 120

// loggedID is a message id as logs show it, cut to maxLoggedID bytes
// (slog quotes or escapes any control character).
func loggedID(id string) string {
	if len(id) > maxLoggedID {
		return id[:maxLoggedID] + "..."
	}
	return id
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
			c.Logger.Warn("idemnats: ack failed", "error", err)
		}
		if c.OnHandled != nil {
			c.OnHandled(!replayed)
		}
	case inbox.Drop:
		c.Logger.Error("idemnats: dropping a message that can never be handled", "subject", m.Topic,
			"message_id", loggedID(m.ID), "error", err)
		// A plain +TERM: nats-server 2.9 does not know "+TERM reason"
		// and would deliver the message again after AckWait.
		if terr := msg.Term(); terr != nil {
			c.Logger.Warn("idemnats: terminating the message failed; it will be delivered again", "error", terr)
		}
		if c.OnDropped != nil {
			c.OnDropped(m, err)
		}
	default:
		if ctx.Err() == nil {
			c.Logger.Warn("idemnats: handling failed; the message will be redelivered", "subject", m.Topic, "error", err)
		}
		_ = msg.NakWithDelay(c.RetryDelay)
	}
}
