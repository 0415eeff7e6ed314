// Package events is the messaging side of the payments demo: the
// payment.created event `idem serve --events` commits with every payment
// through a transactional outbox, the broker connections (NATS JetStream,
// RabbitMQ, Kafka) its dispatcher publishes to, and the ledger `idem consume`
// books each event into exactly once through an inbox.
package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/idemhq/idem/idemnats"
	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/outbox"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultSubject is the default --events-subject.
const DefaultSubject = "idem.payments.created"

// TypePaymentCreated is the type of the event committed with a payment.
const TypePaymentCreated = "payment.created"

// PaymentCreated is the payload of a payment.created event.
type PaymentCreated struct {
	Type        string    `json:"type"`
	PaymentID   string    `json:"paymentId"`
	Tenant      string    `json:"tenant"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
	Reference   string    `json:"reference"`
	CreatedAt   time.Time `json:"createdAt"`
}

// MessageID is the outbox message id of a payment's event: derived from the
// payment, so that a re-executed payment cannot add a second event.
func MessageID(paymentID string) string {
	return TypePaymentCreated + ":" + paymentID
}

// Broker names a broker kind.
type Broker string

// The brokers.
const (
	NATS  Broker = "nats"
	AMQP  Broker = "amqp"
	Kafka Broker = "kafka"
)

// forms names the --events forms, for errors.
const forms = "nats://HOST:PORT (JetStream), amqp://USER:PASS@HOST:PORT/ (RabbitMQ) or " + KafkaForm

// BrokerOf classifies an --events URL; a kafka:// URL is also parsed
// (ParseKafkaURL), so that a bad one is refused before anything starts.
func BrokerOf(rawURL string) (Broker, error) {
	if strings.HasPrefix(rawURL, "kafka://") {
		if _, err := ParseKafkaURL(rawURL); err != nil {
			return "", err
		}
		return Kafka, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", fmt.Errorf("--events must be %s: %v", forms, err)
	}
	switch u.Scheme {
	case "nats", "tls":
		return NATS, nil
	case "amqp", "amqps":
		return AMQP, nil
	}
	return "", fmt.Errorf("--events must be %s, not %q", forms, redact(rawURL))
}

// ValidateSubject checks an --events-subject: dot-separated tokens of
// letters, digits, '-' and '_', so that it is a NATS subject and an AMQP
// routing key alike, and names a stream and a consumer.
func ValidateSubject(s string) error {
	if s == "" || len(s) > 200 {
		return errors.New("--events-subject must be 1 to 200 characters")
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return fmt.Errorf("--events-subject %q has an empty token", s)
		}
		for _, r := range tok {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return fmt.Errorf("--events-subject %q: use letters, digits, '-' and '_' between dots", s)
			}
		}
	}
	return nil
}

// redact hides a URL's password for logs.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// Conn is a broker connection for the demo.
type Conn struct {
	// Where describes the broker without credentials, for logs.
	Where string
	// Topic is where the events go: the subject Dial was given, or, on
	// Kafka, the URL's topic parameter.
	Topic string
	// Publisher publishes outbox messages; it creates the stream or
	// exchange it needs on first use, so that the service starts (and
	// takes payments) while the broker is down.
	Publisher outbox.Publisher
	// AckWait is how long the broker waits for a consumer's
	// acknowledgement before it delivers a message again (JetStream's
	// AckWait; RabbitMQ redelivers when the consumer's connection closes).
	// Defaults to 30 seconds.
	AckWait time.Duration
	close   func()
	ping    func(ctx context.Context) error // see Ping
	consume func(ctx context.Context, in *inbox.Inbox, h inbox.Handler, cfg *ConsumeConfig) error
}

// Close closes the connection.
func (c *Conn) Close() {
	if c != nil && c.close != nil {
		c.close()
	}
}

// ConsumeConfig configures Conn.Consume. A nil *ConsumeConfig means all
// defaults.
type ConsumeConfig struct {
	// OnHandled, if set, is called after each message is acknowledged,
	// with whether the handler ran (false for a redelivery of a message
	// already handled).
	OnHandled func(ran bool)
	// OnDropped, if set, is called after a message that can never be
	// handled (an invalid event, no usable message id, an id reused with
	// another payload) was terminated or rejected, with the reason; it has
	// been logged.
	OnDropped func(m inbox.Message, err error)
	// StartFunc (NATS and Kafka) says where a durable consumer that has
	// to be created starts: the publication time of the oldest message it
	// delivers, or the zero time for the whole stream. On NATS it is
	// called at start when the consumer does not exist, and whenever the
	// consumer is re-created because it was deleted or the server lost
	// its JetStream state; on Kafka once at start, for the partitions the
	// group has no committed offset for. Defaults to the whole stream.
	StartFunc func(ctx context.Context) (time.Time, error)
}

// Consume runs the durable consumer (or queue) named after subject,
// handling each message through in, until ctx ends. It re-creates what it
// needs when the broker loses it: the JetStream stream and consumer (a
// consumer deleted, or a server restarted without its store), the
// RabbitMQ queue and exchange (deleted, or a broker restarted without
// them), the Kafka topic (deleted, and perhaps created again: the group
// consumes the new one from its start or StartFunc's time).
func (c *Conn) Consume(ctx context.Context, in *inbox.Inbox, h inbox.Handler, cfg *ConsumeConfig) error {
	if cfg == nil {
		cfg = &ConsumeConfig{}
	}
	return c.consume(ctx, in, h, cfg)
}

// Dial connects to the broker at rawURL for subject. The connection
// reconnects on its own; Dial does not wait for the broker.
func Dial(ctx context.Context, rawURL, subject string, logger *slog.Logger) (*Conn, error) {
	b, err := BrokerOf(rawURL)
	if err != nil {
		return nil, err
	}
	switch b {
	case AMQP:
		return dialAMQP(ctx, rawURL, subject, logger)
	case Kafka:
		return dialKafka(rawURL, subject, logger)
	}
	return dialNATS(rawURL, subject, logger)
}

func dialNATS(rawURL, subject string, logger *slog.Logger) (*Conn, error) {
	last := &lastError{}
	nc, err := nats.Connect(rawURL,
		nats.Name("idem"),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.Timeout(2*time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("events: disconnected from NATS", "error", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { logger.Info("events: reconnected to NATS") }),
		// Every failed connection attempt, for Ping to name.
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { last.set(err) }),
	)
	if err != nil {
		return nil, fmt.Errorf("events: connect to %s: %w", redact(rawURL), err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(5*time.Second))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("events: %w", err)
	}
	var conn *Conn
	p := &ensuring{
		ensure: func(ctx context.Context) error { _, err := idemnats.EnsureStream(ctx, js, subject); return err },
		pub:    idemnats.NewPublisher(js),
	}
	conn = &Conn{
		Where:     redact(rawURL),
		Topic:     subject,
		Publisher: p,
		close:     nc.Close,
		ping:      natsPing(nc, js, last),
		consume: func(ctx context.Context, in *inbox.Inbox, h inbox.Handler, cfg *ConsumeConfig) error {
			ensure := func(ctx context.Context) (jetstream.Consumer, error) {
				return idemnats.EnsureConsumerConfig(ctx, js, subject, &idemnats.ConsumerConfig{AckWait: conn.AckWait, StartFunc: cfg.StartFunc})
			}
			var cons jetstream.Consumer
			for {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				cons, err = ensure(cctx)
				cancel()
				if err == nil {
					break
				}
				logger.Warn("events: cannot create the consumer yet; retrying", "error", err)
				if !sleep(ctx, time.Second) {
					return nil
				}
			}
			return idemnats.Consume(ctx, cons, in, h, &idemnats.ConsumeConfig{Logger: logger, OnHandled: cfg.OnHandled,
				OnDropped: cfg.OnDropped, ConsumerFunc: ensure})
		},
	}
	return conn, nil
}

// ensuring runs ensure (stream or exchange creation) before its first
// publish, and again after a failed one.
type ensuring struct {
	mu     sync.Mutex
	ok     bool
	ensure func(ctx context.Context) error
	pub    outbox.Publisher
}

func (e *ensuring) Publish(ctx context.Context, msgs []outbox.Message) []error {
	e.mu.Lock()
	if !e.ok {
		if err := e.ensure(ctx); err != nil {
			e.mu.Unlock()
			errs := make([]error, len(msgs))
			for i := range errs {
				errs[i] = err
			}
			return errs
		}
		e.ok = true
	}
	e.mu.Unlock()
	errs := e.pub.Publish(ctx, msgs)
	if errs != nil {
		e.mu.Lock()
		e.ok = false
		e.mu.Unlock()
	}
	return errs
}

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

// Event returns the outbox message of a payment's event. Its key is the
// payment id: a payment's events stay in order (the outbox publishes them
// one after another; Kafka keeps them on one partition), while different
// payments spread evenly over the partitions (a tenant key would put a
// large tenant's whole traffic on one).
func Event(subject string, e PaymentCreated) (outbox.Message, error) {
	e.Type = TypePaymentCreated
	b, err := json.Marshal(e)
	if err != nil {
		return outbox.Message{}, err
	}
	return outbox.Message{
		ID:      MessageID(e.PaymentID),
		Topic:   subject,
		Key:     e.PaymentID,
		Payload: b,
		Headers: map[string]string{"Content-Type": "application/json", "Event-Type": TypePaymentCreated},
	}, nil
}
