package idemamqp_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemamqp"
	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/sqlitestore"
	amqp "github.com/rabbitmq/amqp091-go"
)

const defaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

func amqpURL() string {
	if u := os.Getenv("IDEM_TEST_AMQP_URL"); u != "" {
		return u
	}
	return defaultAMQPURL
}

// fixture is an exchange and a queue of the test's own, deleted at the end.
type fixture struct {
	dial     idemamqp.DialFunc
	exchange string
	queue    string
	key      string
	conn     *amqp.Connection
}

func setup(t testing.TB) *fixture {
	t.Helper()
	dial := idemamqp.Dial(amqpURL())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := dial(ctx)
	if err != nil {
		u, _ := url.Parse(amqpURL())
		if os.Getenv("CI") != "" {
			t.Fatalf("RabbitMQ at %s is unreachable (CI is set): %v", u.Redacted(), err)
		}
		t.Skipf("RabbitMQ at %s is unreachable: %v", u.Redacted(), err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "t" + hex.EncodeToString(b)
	f := &fixture{dial: dial, exchange: name, queue: name + ".q", key: name + ".created", conn: conn}
	t.Cleanup(func() {
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		_, _ = ch.QueueDelete(f.queue, false, false, false)
		_ = ch.ExchangeDelete(f.exchange, false, false)
	})
	return f
}

func (f *fixture) topology() idemamqp.TopologyFunc {
	return idemamqp.Declare(f.exchange, f.queue, f.key)
}

func (f *fixture) ready(t testing.TB) int {
	t.Helper()
	ch, err := f.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(f.queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

func TestPublisherConfirmsAndReturns(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p, err := idemamqp.NewPublisher(f.dial, idemamqp.PublisherConfig{Exchange: f.exchange, Topology: f.topology()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := p.Publish(ctx, []outbox.Message{
		{ID: "a", Topic: f.key, Payload: []byte("1"), Headers: map[string]string{"Content-Type": "application/json"}},
		{ID: "b", Topic: f.key + ".nobody", Payload: []byte("2")}, // no queue takes it
		{ID: "c", Topic: f.key, Payload: []byte("3")},
	})
	if len(errs) != 3 || errs[0] != nil || errs[2] != nil || errs[1] == nil || !strings.Contains(errs[1].Error(), "unroutable") {
		t.Fatalf("errors %v; want only b unroutable", errs)
	}
	deadline := time.Now().Add(10 * time.Second)
	for f.ready(t) != 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // the queue's count lags the confirm slightly
	}
	if n := f.ready(t); n != 2 {
		t.Fatalf("%d messages in the queue, want 2", n)
	}
	ch, _ := f.conn.Channel()
	defer ch.Close()
	d, ok, err := ch.Get(f.queue, true)
	if err != nil || !ok || d.MessageId != "a" || d.DeliveryMode != amqp.Persistent || d.ContentType != "application/json" || string(d.Body) != "1" {
		t.Fatalf("first message %+v, %v, %v", d, ok, err)
	}
	// A closed connection is reopened on the next publish.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if errs := p.Publish(ctx, []outbox.Message{{ID: "d", Topic: f.key}}); errs != nil {
		t.Fatalf("publish after Close: %v", errs)
	}
}

// Consume books each delivery once through a SQLite inbox: a failed
// handler's message is requeued and booked once, a message committed by an
// earlier delivery is acked without running, and one without message-id is
// rejected.
func TestConsumeThroughInbox(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "in.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE booked (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	exec, _ := idem.NewExecutor(st, nil)
	in, err := inbox.New(exec, inbox.Config{Name: f.queue})
	if err != nil {
		t.Fatal(err)
	}
	failedOnce := false
	book := func(ctx context.Context, m inbox.Message) error {
		tx, err := sqlitestore.Tx(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO booked (id) VALUES (?)`, m.ID); err != nil {
			return err
		}
		if m.ID == "m-5" && !failedOnce {
			failedOnce = true
			return errors.New("fails once, after writing")
		}
		return nil
	}
	if a, _, err := in.Process(ctx, inbox.Message{ID: "m-2", Topic: f.key, Payload: []byte("2")}, book); a != inbox.Ack || err != nil {
		t.Fatal(a, err)
	}
	p, _ := idemamqp.NewPublisher(f.dial, idemamqp.PublisherConfig{Exchange: f.exchange, Topology: f.topology()})
	defer p.Close()
	const n = 10
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, outbox.Message{ID: fmt.Sprint("m-", i), Topic: f.key, Payload: []byte(fmt.Sprint(i))})
	}
	msgs = append(msgs, msgs[7]) // a re-published copy (RabbitMQ keeps both)
	if errs := p.Publish(ctx, msgs); errs != nil {
		t.Fatal(errs)
	}
	ch, _ := f.conn.Channel()
	if err := ch.PublishWithContext(ctx, f.exchange, f.key, true, false, amqp.Publishing{Body: []byte("no id")}); err != nil {
		t.Fatal(err)
	}
	ch.Close()

	handled := make(chan bool, 4*n)
	cctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- idemamqp.Consume(cctx, f.dial, f.queue, in, book, &idemamqp.ConsumeConfig{Topology: f.topology(), RetryDelay: 20 * time.Millisecond,
			OnHandled: func(ran bool) { handled <- ran }})
	}()
	ran, replays := 0, 0
	for ran+replays < n+1 {
		select {
		case r := <-handled:
			if r {
				ran++
			} else {
				replays++
			}
		case <-ctx.Done():
			t.Fatalf("%d ran, %d replays", ran, replays)
		}
	}
	// The message without an id is rejected, not requeued.
	deadline := time.Now().Add(10 * time.Second)
	for f.ready(t) != 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ran != n-1 || replays != 2 {
		t.Errorf("%d ran and %d replays; want %d ran (m-2 was done) and 2 replays (m-2, the copy of m-7)", ran, replays, n-1)
	}
	var rows, distinct int
	if err := st.ReadDB().QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT id) FROM booked`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != n || distinct != n {
		t.Errorf("%d rows (%d distinct), want %d", rows, distinct, n)
	}
	if q := f.ready(t); q != 0 {
		t.Errorf("%d messages left in the queue", q)
	}
}
