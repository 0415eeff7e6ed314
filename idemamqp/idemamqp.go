// Package idemamqp connects idem's outbox and inbox to RabbitMQ (AMQP
// 0-9-1, github.com/rabbitmq/amqp091-go).
//
// Publisher is an outbox.Publisher: it publishes persistent messages with
// the outbox message id as the AMQP message-id, on a channel in confirm
// mode, and reports a message sent only when RabbitMQ confirmed it (and did
// not return it as unroutable). It reconnects on its own after the
// connection is lost.
//
// Consume feeds a queue's deliveries to an inbox.Inbox with manual
// acknowledgement: a delivery is acknowledged only after the handler's
// writes and the inbox record committed; a redelivery (RabbitMQ requeues
// every unacknowledged delivery when a consumer's connection closes) is
// acknowledged without running the handler again.
//
// RabbitMQ has no publisher-side deduplication: a message re-published
// after a dispatcher crash reaches the queue twice, and the consumer's
// inbox drops the copy.
package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/outbox"
	amqp "github.com/rabbitmq/amqp091-go"
)

// DialFunc opens a connection. Dial returns one for a URL.
type DialFunc func(ctx context.Context) (*amqp.Connection, error)

// TopologyFunc declares what a channel needs (exchanges, queues,
// bindings); it runs on every new channel, so declarations must be
// idempotent (they are in AMQP when the arguments match).
type TopologyFunc func(ch *amqp.Channel) error

// Dial returns a DialFunc for url that bounds connecting by 5 seconds (or
// ctx) and sends heartbeats every 10 seconds, so that a dead broker is
// noticed.
func Dial(url string) DialFunc {
	return func(ctx context.Context) (*amqp.Connection, error) {
		timeout := 5 * time.Second
		if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
			timeout = max(time.Until(d), time.Millisecond)
		}
		return amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(timeout), Heartbeat: 10 * time.Second})
	}
}

// Declare returns a TopologyFunc for the usual layout: a durable topic
// exchange, and a durable queue bound to it with routing key key. Either
// name may be empty to skip it.
func Declare(exchange, queue, key string) TopologyFunc {
	return func(ch *amqp.Channel) error {
		if exchange != "" {
			if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
				return fmt.Errorf("idemamqp: declare exchange %s: %w", exchange, err)
			}
		}
		if queue != "" {
			if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
				return fmt.Errorf("idemamqp: declare queue %s: %w", queue, err)
			}
			if exchange != "" {
				if err := ch.QueueBind(queue, key, exchange, false, nil); err != nil {
					return fmt.Errorf("idemamqp: bind queue %s: %w", queue, err)
				}
			}
		}
		return nil
	}
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Exchange receives the messages, routed by their Topic. Required.
	Exchange string
	// Topology runs on each new channel before publishing; declare the
	// exchange and the queues there. A message that no queue takes is
	// returned by RabbitMQ and reported failed (it stays in the outbox),
	// so declare consumers' queues here too if messages must be kept
	// before any consumer ran. Optional.
	Topology TopologyFunc
}

// Publisher publishes outbox messages to RabbitMQ with publisher confirms.
// It is safe for concurrent use; calls are serialised on one channel.
type Publisher struct {
	dial DialFunc
	cfg  PublisherConfig

	mu      sync.Mutex
	conn    *amqp.Connection
	ch      *amqp.Channel
	returns chan amqp.Return
}

var _ outbox.Publisher = (*Publisher)(nil)

// NewPublisher returns a Publisher that connects with dial when it first
// publishes, and again after the connection is lost.
func NewPublisher(dial DialFunc, cfg PublisherConfig) (*Publisher, error) {
	if dial == nil || cfg.Exchange == "" {
		return nil, errors.New("idemamqp: NewPublisher needs a dial function and an exchange")
	}
	return &Publisher{dial: dial, cfg: cfg}, nil
}

// maxBatch bounds the returns buffered for one Publish call.
const maxBatch = 1024

// channel returns the open confirm-mode channel, connecting first if need
// be. p.mu is held.
func (p *Publisher) channel(ctx context.Context) (*amqp.Channel, error) {
	if p.ch != nil && !p.ch.IsClosed() {
		return p.ch, nil
	}
	p.reset()
	conn, err := p.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("idemamqp: connect: %w", err)
	}
	ch, err := conn.Channel()
	if err == nil && p.cfg.Topology != nil {
		err = p.cfg.Topology(ch)
	}
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("idemamqp: open channel: %w", err)
	}
	p.conn, p.ch = conn, ch
	p.returns = ch.NotifyReturn(make(chan amqp.Return, maxBatch))
	return ch, nil
}

// reset drops the connection. p.mu is held.
func (p *Publisher) reset() {
	if p.conn != nil {
		_ = p.conn.Close()
	}
	p.conn, p.ch, p.returns = nil, nil, nil
}

// Close closes the connection.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.reset()
	return nil
}

// Publish implements outbox.Publisher: persistent, mandatory messages with
// MessageId set to the outbox id, each confirmed before it counts as sent.
func (p *Publisher) Publish(ctx context.Context, msgs []outbox.Message) []error {
	errs := make([]error, len(msgs))
	fail := func(from int, err error) []error {
		for i := from; i < len(msgs); i++ {
			if errs[i] == nil {
				errs[i] = err
			}
		}
		return errs
	}
	if len(msgs) > maxBatch {
		return fail(0, fmt.Errorf("idemamqp: more than %d messages in one call", maxBatch))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ch, err := p.channel(ctx)
	if err != nil {
		return fail(0, err)
	}
	drain(p.returns)
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		pub := amqp.Publishing{MessageId: m.ID, Body: m.Payload, DeliveryMode: amqp.Persistent, Timestamp: time.Now()}
		if len(m.Headers) > 0 {
			pub.Headers = make(amqp.Table, len(m.Headers))
			for k, v := range m.Headers {
				pub.Headers[k] = v
			}
			pub.ContentType = m.Headers["Content-Type"]
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, p.cfg.Exchange, m.Topic, true, false, pub)
		if err != nil {
			p.reset()
			return fail(i, fmt.Errorf("idemamqp: publish: %w", err))
		}
		confirms[i] = dc
	}
	failed := false
	for i, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		switch {
		case err != nil:
			p.reset() // the confirmation may never come on this channel
			return fail(i, fmt.Errorf("idemamqp: no confirmation: %w", err))
		case !ok:
			errs[i], failed = errors.New("idemamqp: the broker refused the message (nack)"), true
		}
	}
	// Returns precede their confirmations on the wire, so every return of
	// this batch is buffered by now.
	returned := map[string]uint16{}
	for _, r := range drain(p.returns) {
		returned[r.MessageId] = r.ReplyCode
	}
	for i, m := range msgs {
		if code, ok := returned[m.ID]; ok && errs[i] == nil {
			errs[i], failed = fmt.Errorf("idemamqp: unroutable: no queue takes routing key %q on exchange %s (reply %d)", m.Topic, p.cfg.Exchange, code), true
		}
	}
	if len(returned) > 0 && p.cfg.Topology != nil {
		// The queues the topology declares may have been deleted (or
		// lost in a broker restart) since this channel declared them:
		// the next call opens a new channel, which declares them again.
		p.reset()
	}
	if !failed {
		return nil
	}
	return errs
}

func drain(c chan amqp.Return) []amqp.Return {
	var rs []amqp.Return
	for {
		select {
		case r, ok := <-c:
			if !ok {
				return rs
			}
			rs = append(rs, r)
		default:
			return rs
		}
	}
}

// ConsumeConfig configures Consume. A nil *ConsumeConfig means all
// defaults.
type ConsumeConfig struct {
	// Topology runs on each new channel before consuming (declare the
	// queue and its binding). Optional.
	Topology TopologyFunc
	// Prefetch is the channel's QoS prefetch count. Defaults to 100.
	Prefetch int
	// RetryDelay is how long Consume waits before requeueing a delivery
	// whose handling failed (RabbitMQ redelivers a requeued message at
	// once). Defaults to one second.
	RetryDelay time.Duration
	// Logger receives failures and dropped messages. Defaults to
	// discarding.
	Logger *slog.Logger
	// OnHandled, if set, is called after each delivery is acknowledged,
	// with whether the handler ran (false for a redelivery it had
	// handled).
	OnHandled func(ran bool)
	// OnDropped, if set, is called after a delivery that can never be
	// handled (inbox.Drop: no usable message-id, an id reused with another
	// payload, or a handler error wrapping inbox.ErrUnprocessable) was
	// rejected, with the reason. Consume has logged it.
	OnDropped func(m inbox.Message, err error)
}

// Consume consumes queue with manual acknowledgement, processing each
// delivery through in with h, until ctx ends; it then returns nil. It
// reconnects (with back-off up to 5 seconds, from 100 milliseconds again
// after a connection that delivered) whenever the connection or channel
// is lost, or the queue is deleted (RabbitMQ then cancels the consumer);
// ConsumeConfig.Topology runs on each new channel, so a queue that was
// deleted, or lost in a broker restart, is declared again. A delivery is acknowledged after Inbox.Process
// committed it, requeued after RetryDelay when it must be retried, and
// rejected without requeueing when it can never be handled (no
// message-id, or an id reused with another payload).
func Consume(ctx context.Context, dial DialFunc, queue string, in *inbox.Inbox, h inbox.Handler, cfg *ConsumeConfig) error {
	var c ConsumeConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Prefetch == 0 {
		c.Prefetch = 100
	}
	if c.RetryDelay == 0 {
		c.RetryDelay = time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	const firstBackoff = 100 * time.Millisecond
	backoff := firstBackoff
	for ctx.Err() == nil {
		delivered, err := consumeOnce(ctx, dial, queue, in, h, &c)
		if ctx.Err() != nil {
			break
		}
		if delivered {
			backoff = firstBackoff
		}
		c.Logger.Warn("idemamqp: consumer disconnected; reconnecting", "queue", queue, "error", err, "in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		backoff = min(2*backoff, 5*time.Second)
	}
	return nil
}

// consumeOnce consumes queue on one connection until it is lost, the
// consumer is cancelled, or ctx ends (nil). delivered reports whether it
// received any delivery.
func consumeOnce(ctx context.Context, dial DialFunc, queue string, in *inbox.Inbox, h inbox.Handler, c *ConsumeConfig) (delivered bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := dial(dctx)
	cancel()
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	if c.Topology != nil {
		if err := c.Topology(ch); err != nil {
			return false, err
		}
	}
	if err := ch.Qos(c.Prefetch, 0, false); err != nil {
		return false, err
	}
	// A deleted queue cancels its consumers: the delivery channel closes,
	// and the next connection declares the queue again.
	cancelled := ch.NotifyCancel(make(chan string, 1))
	deliveries, err := ch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	if err != nil {
		return false, err
	}
	for {
		select {
		case <-ctx.Done():
			return delivered, nil
		case d, ok := <-deliveries:
			if !ok {
				select {
				case <-cancelled:
					return delivered, fmt.Errorf("idemamqp: the broker cancelled the consumer of queue %s (deleted?)", queue)
				default:
				}
				return delivered, errors.New("idemamqp: delivery channel closed")
			}
			delivered = true
			handle(ctx, d, in, h, c)
		}
	}
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

func handle(ctx context.Context, d amqp.Delivery, in *inbox.Inbox, h inbox.Handler, c *ConsumeConfig) {
	m := inbox.Message{ID: d.MessageId, Topic: d.RoutingKey, Payload: d.Body}
	if len(d.Headers) > 0 {
		m.Headers = make(map[string]string, len(d.Headers))
		for k, v := range d.Headers {
			if s, ok := v.(string); ok {
				m.Headers[k] = s
			}
		}
	}
	action, replayed, err := in.Process(ctx, m, h)
	switch action {
	case inbox.Ack:
		if err := d.Ack(false); err != nil {
			// Requeued when the channel closes; then a replay.
			c.Logger.Warn("idemamqp: ack failed", "error", err)
		}
		if c.OnHandled != nil {
			c.OnHandled(!replayed)
		}
	case inbox.Drop:
		c.Logger.Error("idemamqp: rejecting a message that can never be handled", "routing_key", m.Topic,
			"message_id", loggedID(m.ID), "error", err)
		if rerr := d.Reject(false); rerr != nil {
			c.Logger.Warn("idemamqp: reject failed; the message will be delivered again", "error", rerr)
		}
		if c.OnDropped != nil {
			c.OnDropped(m, err)
		}
	default:
		if ctx.Err() == nil {
			c.Logger.Warn("idemamqp: handling failed; the message will be redelivered", "routing_key", m.Topic, "error", err)
			t := time.NewTimer(c.RetryDelay)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
		}
		_ = d.Nack(false, true)
	}
}
