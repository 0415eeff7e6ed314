package events

import (
	"context"
	"log/slog"
	"strings"

	"github.com/idemhq/idem/idemamqp"
	"github.com/idemhq/idem/inbox"
)

// AMQPNames returns the exchange and queue the demo uses for subject on
// RabbitMQ: a durable topic exchange named after the subject's first token
// ("idem.payments.created" → "idem"), and a durable queue named after the
// subject, bound with the subject as routing key.
func AMQPNames(subject string) (exchange, queue string) {
	first, _, _ := strings.Cut(subject, ".")
	return first, subject
}

func dialAMQP(_ context.Context, rawURL, subject string, logger *slog.Logger) (*Conn, error) {
	exchange, queue := AMQPNames(subject)
	// Both sides declare the queue: events published before the first
	// consumer ran are kept, not returned as unroutable.
	topology := idemamqp.Declare(exchange, queue, subject)
	dial := idemamqp.Dial(rawURL)
	pub, err := idemamqp.NewPublisher(dial, idemamqp.PublisherConfig{Exchange: exchange, Topology: topology})
	if err != nil {
		return nil, err
	}
	probe := &amqpProbe{dial: dial}
	return &Conn{
		Where:     redact(rawURL),
		Topic:     subject,
		Publisher: pub,
		close:     func() { _ = pub.Close(); probe.close() },
		ping:      probe.ping,
		consume: func(ctx context.Context, in *inbox.Inbox, h inbox.Handler, cfg *ConsumeConfig) error {
			// Consume declares the queue, exchange and binding on every
			// connection, and reconnects when the queue is deleted
			// (RabbitMQ cancels its consumers), so a queue lost in a
			// deletion or a broker restart is declared again.
			return idemamqp.Consume(ctx, dial, queue, in, h, &idemamqp.ConsumeConfig{Topology: topology, Logger: logger,
				OnHandled: cfg.OnHandled, OnDropped: cfg.OnDropped})
		},
	}, nil
}
