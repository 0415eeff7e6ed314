package e2e

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/idemhq/idem/cmd/idem/internal/events"
	amqp "github.com/rabbitmq/amqp091-go"
)

const defaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

// amqpFixture is a RabbitMQ connection for a test and a subject of its
// own (its own exchange and queue, deleted when the test ends).
type amqpFixture struct {
	url     string
	subject string
	conn    *amqp.Connection
}

func newAMQP(t *testing.T) *amqpFixture {
	t.Helper()
	raw := envOr("IDEM_TEST_AMQP_URL", defaultAMQPURL)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	requireReachable(t, "RabbitMQ", "tcp", u.Host)
	conn, err := amqp.DialConfig(raw, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		t.Fatalf("connect to RabbitMQ: %v", err)
	}
	f := &amqpFixture{url: raw, conn: conn, subject: "e" + randomName(6) + ".payments.created"}
	t.Cleanup(func() {
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		exchange, queue := events.AMQPNames(f.subject)
		if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
			t.Errorf("delete queue %s: %v", queue, err)
		}
		if err := ch.ExchangeDelete(exchange, false, false); err != nil {
			t.Errorf("delete exchange %s: %v", exchange, err)
		}
	})
	return f
}

func (f *amqpFixture) URL() string             { return f.url }
func (f *amqpFixture) Subject() string         { return f.subject }
func (f *amqpFixture) URLVia(hp string) string { return replaceHost(f.url, hp) }
func (f *amqpFixture) HostPort(t *testing.T) string {
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// Settled reports whether the queue has no message ready. (RabbitMQ does
// not tell a client how many are unacknowledged; an unacknowledged copy
// that is redelivered is a replay and adds no ledger row.)
func (f *amqpFixture) Settled(context.Context) (bool, error) {
	ch, err := f.conn.Channel()
	if err != nil {
		return false, err
	}
	defer ch.Close()
	_, queue := events.AMQPNames(f.subject)
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return false, err
	}
	return q.Messages == 0, nil
}
