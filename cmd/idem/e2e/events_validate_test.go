package e2e

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/cmd/idem/internal/events"
	"github.com/idemhq/idem/idemamqp"
	"github.com/idemhq/idem/idemnats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
)

// refusedSecret is in the references of refused events: it must never
// reach consume's log.
const refusedSecret = "card-4111111111111111-secret"

// newPaymentID returns a payment id of the API's form, pay_ and 26
// characters of a-z.
func newPaymentID() string {
	b := make([]byte, 26)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = 'a' + b[i]%26
	}
	return "pay_" + string(b)
}

// eventPayload is the JSON idem serve publishes for payment id, with
// fields overridden by over (raw JSON values).
func eventPayload(id string, over map[string]string) []byte {
	f := map[string]string{"type": `"payment.created"`, "paymentId": `"` + id + `"`, "tenant": `"anonymous"`,
		"amountCents": "2599", "currency": `"USD"`, "reference": `"order-1"`, "createdAt": `"2026-12-01T10:00:00Z"`}
	for k, v := range over {
		f[k] = v
	}
	var b strings.Builder
	b.WriteString("{")
	first := true
	for _, k := range []string{"type", "paymentId", "tenant", "amountCents", "currency", "reference", "createdAt", "pad"} {
		v, ok := f[k]
		if !ok {
			continue
		}
		if !first {
			b.WriteString(",")
		}
		first = false
		fmt.Fprintf(&b, "%q:%s", k, v)
	}
	b.WriteString("}")
	return []byte(b.String())
}

// refusedEvent is an invalid event and what consume's log must say of it.
type refusedEvent struct {
	name    string
	id      string
	payload []byte
	reason  string
}

// invalidEvents are one event of each class idem consume refuses.
func invalidEvents() []refusedEvent {
	ev := func(name, reason string, over map[string]string) refusedEvent {
		p := newPaymentID()
		return refusedEvent{name: name, id: events.MessageID(p), payload: eventPayload(p, over), reason: reason}
	}
	quoted, _ := json.Marshal("order \x1b]52;c;" + refusedSecret + "\x07")
	long, _ := json.Marshal(strings.Repeat("r", 101))
	malformed := newPaymentID()
	return []refusedEvent{
		ev("negative amount", "amountCents must be greater than 0", map[string]string{"amountCents": "-2599"}),
		ev("zero amount", "amountCents must be greater than 0", map[string]string{"amountCents": "0"}),
		ev("amount overflow", "amountCents must be at most", map[string]string{"amountCents": "99999999999999999999"}),
		ev("amount over the maximum", "amountCents must be at most", map[string]string{"amountCents": "1000000000000001"}),
		ev("unknown currency", "currency is not an ISO 4217", map[string]string{"currency": `"ZZZ"`}),
		ev("control characters", "reference must not contain control characters", map[string]string{"reference": string(quoted)}),
		ev("invalid UTF-8", "not valid UTF-8", map[string]string{"reference": "\"order-\xff\xfe" + refusedSecret + "\""}),
		ev("oversized reference", "reference must be at most 100 characters", map[string]string{"reference": string(long)}),
		ev("oversized payload", "more than 16384", map[string]string{"pad": `"` + strings.Repeat("x", 20<<10) + `"`}),
		{name: "malformed JSON", id: events.MessageID(malformed), payload: []byte(`{"type":"payment.created","paymentId":"` + malformed + `",`),
			reason: "not valid JSON"},
	}
}

// Every class of invalid event, published straight to the broker: each is
// logged with its message id and why, counted, dropped at the broker (not
// redelivered), and never booked; the valid events around them are.
func TestConsumeRefusesInvalidEventsNATS(t *testing.T) {
	t.Parallel()
	nf := newNATS(t)
	ctx := testContext(t)
	if _, err := idemnats.EnsureStream(ctx, nf.js, nf.subject); err != nil {
		t.Fatal(err)
	}
	publish := func(id string, payload []byte) {
		t.Helper()
		m := nats.NewMsg(nf.subject)
		m.Data = payload
		m.Header.Set(jetstream.MsgIDHeader, id)
		if _, err := nf.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	cons := testRefusesInvalidEvents(t, nf.url, nf.subject, publish, nil)
	eventually(t, 30*time.Second, 50*time.Millisecond, "the consumer settled (nothing redelivered)", func() (bool, error) {
		c, err := nf.js.Consumer(ctx, nf.stream, idemnats.ConsumerFor(nf.subject))
		if err != nil {
			return false, err
		}
		info, err := c.Info(ctx)
		if err != nil {
			return false, err
		}
		return info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0,
			fmt.Errorf("pending %d, unacknowledged %d, redelivered %d", info.NumPending, info.NumAckPending, info.NumRedelivered)
	})
	if n := cons.mustMetric(t, `idem_consume_refused_total{reason="invalid_event"}`); n != float64(len(invalidEvents())) {
		t.Errorf("refused %v after settling, want %d", n, len(invalidEvents()))
	}
}

func TestConsumeRefusesInvalidEventsAMQP(t *testing.T) {
	t.Parallel()
	af := newAMQP(t)
	exchange, queue := events.AMQPNames(af.subject)
	ch, err := af.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := idemamqp.Declare(exchange, queue, af.subject)(ch); err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	publish := func(id string, payload []byte) {
		t.Helper()
		if err := ch.PublishWithContext(ctx, exchange, af.subject, true, false, amqp.Publishing{MessageId: id, Body: payload, DeliveryMode: amqp.Persistent}); err != nil {
			t.Fatal(err)
		}
	}
	// RabbitMQ keeps no publisher-side window: an id reused with another
	// payload reaches the consumer, and one without an id too.
	cons := testRefusesInvalidEvents(t, af.url, af.subject, publish, func(validID string) {
		publish(validID, eventPayload(strings.TrimPrefix(validID, events.TypePaymentCreated+":"), map[string]string{"amountCents": "1"}))
		publish("", eventPayload(newPaymentID(), nil))
	})
	eventually(t, 30*time.Second, 50*time.Millisecond, "the queue empty", func() (bool, error) { return af.Settled(ctx) })
	if n := cons.mustMetric(t, `idem_consume_refused_total{reason="reused_id"}`); n != 1 {
		t.Errorf("refused with a reused id: %v, want 1", n)
	}
	if n := cons.mustMetric(t, `idem_consume_refused_total{reason="invalid_id"}`); n != 1 {
		t.Errorf("refused without an id: %v, want 1", n)
	}
}

// testRefusesInvalidEvents runs idem consume on the broker, publishes a
// valid event, every invalid one, then the further refused deliveries of
// more (if set) and a last valid event, and checks the ledger, the metrics and the log once the
// last one is booked (the consumer handles one delivery at a time, in
// order). It returns the consumer.
func testRefusesInvalidEvents(t *testing.T, url, subject string, publish func(id string, payload []byte), more func(validID string)) *server {
	consumePath := t.TempDir() + "/consume.db"
	cons := startCommand(t, "consume", "consume", "--db", consumePath, "--events", url, "--events-subject", subject, "--lease", "1s")
	first, last := newPaymentID(), newPaymentID()
	publish(events.MessageID(first), eventPayload(first, nil))
	waitBooked(t, cons, 1, time.Minute, "the first valid event booked")
	bad := invalidEvents()
	for _, e := range bad {
		publish(e.id, e.payload)
	}
	if more != nil {
		more(events.MessageID(first))
	}
	publish(events.MessageID(last), eventPayload(last, map[string]string{"currency": `" eur "`, "reference": `" order-2 "`}))
	waitBooked(t, cons, 2, time.Minute, "the last valid event booked")

	db := openRO(t, consumePath)
	if n := queryInt(t, db, "SELECT COUNT(*) FROM ledger WHERE payment_id IN (?, ?)", first, last); n != 2 {
		t.Errorf("%d ledger rows for the valid events, want 2", n)
	}
	if n := queryInt(t, db, "SELECT COUNT(*) FROM ledger WHERE payment_id = ? AND currency = 'EUR' AND reference = 'order-2'", last); n != 1 {
		t.Errorf("the last event is not booked normalised as the API normalises (EUR, order-2)")
	}
	if n := cons.mustMetric(t, `idem_consume_refused_total{reason="invalid_event"}`); n != float64(len(bad)) {
		t.Errorf("idem_consume_refused_total{reason=invalid_event} = %v, want %d", n, len(bad))
	}
	if n := cons.mustMetric(t, "idem_consume_booked_total"); n != 2 {
		t.Errorf("idem_consume_booked_total = %v, want 2", n)
	}
	for _, e := range bad {
		if !cons.log.contains(e.id) {
			t.Errorf("%s: its message id %s is not in consume's log", e.name, e.id)
		}
		if !cons.log.contains(e.reason) {
			t.Errorf("%s: consume's log does not say %q", e.name, e.reason)
		}
	}
	if cons.log.contains(refusedSecret) {
		t.Errorf("consume's log quotes a refused payload:\n%s", cons.log.tail(40))
	}
	if t.Failed() {
		t.Logf("consume log:\n%s", cons.log.tail(40))
	}
	return cons
}
