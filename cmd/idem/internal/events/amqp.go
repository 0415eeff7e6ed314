package events

import (
	"context"
	"log/slog"
	"strings"

	"github.com/idemhq/idem/amqpidem"
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
	topology := amqpidem.Declare(exchange, queue, subject)
	dial := amqpidem.Dial(rawURL)
	pub, err := amqpidem.NewPublisher(dial, amqpidem.PublisherConfig{Exchange: exchange, Topology: topology})
	if err != nil {
		return nil, err
	}
	return &Conn{
		Where:     redact(rawURL),
		Topic:     subject,
		Publisher: pub,
		close:     func() { _ = pub.Close() },
		consume: func(ctx context.Context, in *inbox.Inbox, h inbox.Handler, cfg *ConsumeConfig) error {
			// Consume declares the queue, exchange and binding on every
			// connection, and reconnects when the queue is deleted
			// (RabbitMQ cancels its consumers), so a queue lost in a
			// deletion or a broker restart is declared again.
			return amqpidem.Consume(ctx, dial, queue, in, h, &amqpidem.ConsumeConfig{Topology: topology, Logger: logger,
				OnHandled: cfg.OnHandled, OnDropped: cfg.OnDropped})
		},
	}, nil
}
