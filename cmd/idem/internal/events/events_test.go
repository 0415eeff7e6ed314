package events

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/idemhq/idem/idemnats"
	"github.com/idemhq/idem/outbox"
)

func TestBrokerOf(t *testing.T) {
	t.Parallel()
	for url, want := range map[string]Broker{
		"nats://127.0.0.1:4222": NATS, "tls://h:4222": NATS,
		"amqp://guest:guest@127.0.0.1:5672/": AMQP, "amqps://h/vhost": AMQP,
		"kafka://127.0.0.1:9092": Kafka, "kafka://a:1,b:2?topic=t": Kafka, "kafka://h:9092?bogus=1": "",
		"http://x": "", "127.0.0.1:4222": "", "": "",
	} {
		got, err := BrokerOf(url)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("BrokerOf(%q) = %q, %v; want %q", url, got, err, want)
		}
	}
	if _, err := BrokerOf("ftp://user:secret@h"); err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("error %v must not show the password", err)
	}
	// A bad URL names every supported form.
	if _, err := BrokerOf("redis://h"); err == nil || !strings.Contains(err.Error(), "nats://") || !strings.Contains(err.Error(), "amqp://") || !strings.Contains(err.Error(), "kafka://") {
		t.Errorf("error %v must name the nats://, amqp:// and kafka:// forms", err)
	}
}

func TestEventMessage(t *testing.T) {
	t.Parallel()
	m, err := Event(DefaultSubject, PaymentCreated{PaymentID: "pay_1", Tenant: "t_1", AmountCents: 100, Currency: "USD", Reference: "r"})
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Validate(m); err != nil {
		t.Fatal(err)
	}
	var e map[string]any
	if err := json.Unmarshal(m.Payload, &e); err != nil {
		t.Fatal(err)
	}
	if m.ID != "payment.created:pay_1" || m.Topic != DefaultSubject || m.Key != "pay_1" || e["type"] != "payment.created" || e["paymentId"] != "pay_1" ||
		e["tenant"] != "t_1" || e["amountCents"] != 100.0 || e["currency"] != "USD" || e["reference"] != "r" {
		t.Fatalf("event %+v %v", m, e)
	}
}

// FuzzValidateSubject: every accepted subject is a valid outbox topic and
// names a stream, a consumer and AMQP exchange and queue.
func FuzzValidateSubject(f *testing.F) {
	for _, s := range []string{DefaultSubject, "a", "a.b-c_d.E9", "a..b", "a.*", "a.>", " a", "ä.b", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if ValidateSubject(s) != nil {
			return
		}
		if err := outbox.Validate(outbox.Message{ID: "x", Topic: s}); err != nil {
			t.Fatalf("accepted subject %q is not a topic: %v", s, err)
		}
		stream, filter := idemnats.StreamFor(s)
		if stream == "" || strings.ContainsAny(stream, ". *>") || !strings.HasSuffix(filter, ".>") {
			t.Fatalf("subject %q: stream %q for %q", s, stream, filter)
		}
		if c := idemnats.ConsumerFor(s); c == "" || strings.ContainsAny(c, ". *>") {
			t.Fatalf("subject %q: consumer %q", s, c)
		}
		if ex, q := AMQPNames(s); ex == "" || q != s {
			t.Fatalf("subject %q: exchange %q, queue %q", s, ex, q)
		}
	})
}
