package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/cmd/idem/internal/events"
	"github.com/idemhq/idem/idemkafka"
	"github.com/idemhq/idem/outbox"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// kafkaFixture is an in-process Kafka cluster of the test's own: franz-go's
// kfake, three brokers speaking the Kafka protocol on free loopback ports.
// No Kafka broker is installable on the machines these tests run on; kfake
// is what franz-go tests itself against. It keeps records in memory and
// has no replication, so these tests say nothing about a real cluster's
// durability, leader elections or retention.
type kafkaFixture struct {
	c       *kfake.Cluster
	subject string
	query   string
}

func newKafka(t *testing.T) *kafkaFixture {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &kafkaFixture{c: c, subject: "e" + randomName(6) + ".payments.created", query: "?partitions=4"}
}

func (f *kafkaFixture) URL() string {
	return "kafka://" + strings.Join(f.c.ListenAddrs(), ",") + f.query
}
func (f *kafkaFixture) Subject() string            { return f.subject }
func (f *kafkaFixture) HostPort(*testing.T) string { return f.c.ListenAddrs()[0] }
func (f *kafkaFixture) URLVia(hp string) string    { return "kafka://" + hp + f.query }

// Settled reports whether the consumer group (named after the topic) has
// committed every partition up to its end: nothing is left to read.
func (f *kafkaFixture) Settled(context.Context) (bool, error) {
	gi := f.c.GroupInfo(f.subject)
	if gi == nil {
		return false, fmt.Errorf("no consumer group %s", f.subject)
	}
	for _, pi := range f.c.PartitionInfos(f.subject) {
		if got := gi.Commits[f.subject][pi.Partition].Offset; got != pi.HighWatermark {
			return false, fmt.Errorf("partition %d committed at %d of %d", pi.Partition, got, pi.HighWatermark)
		}
	}
	return true, nil
}

// 500 payments through idem serve --events kafka://, with idem serve killed
// three times and idem consume four times (twice while it works through a
// backlog with slow bookings, so that a kill lands between a booking and
// its offset commit): one ledger row per payment.
func TestEventsKafkaExactlyOnceThroughKills(t *testing.T) {
	t.Parallel()
	testExactlyOnceThroughKills(t, newKafka(t))
}

// With the brokers refusing every produce request (kfake closes the
// connection of each, as a broker going down mid-request does), payments
// still succeed and their events wait in the outbox; once the brokers take
// records again, the same serve process publishes them and consume books
// each once. (A TCP forwarder cannot cut Kafka: clients connect to the
// addresses the brokers advertise, not to the seed they were given.)
func TestEventsKafkaBrokerOutage(t *testing.T) {
	t.Parallel()
	kf := newKafka(t)
	var down atomic.Bool
	kf.c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		kf.c.KeepControl()
		if down.Load() {
			return nil, errors.New("down"), true
		}
		return nil, nil, false
	})
	dir := t.TempDir()
	servePath := dir + "/serve.db"
	srv := startServer(t, "serve", "--db", servePath, "--events", kf.URL(), "--events-subject", kf.Subject(), "--access-log=false")
	cons := startCommand(t, "consume", "consume", "--db", dir+"/consume.db", "--events", kf.URL(), "--events-subject", kf.Subject())
	serveDB := openRO(t, servePath)
	prefix := "out-" + randomName(4)
	mustCreate := func(i int) {
		t.Helper()
		if r := mustPay(t, srv, fmt.Sprintf("%s-%d", prefix, i), paymentBody(100+i, "outage")); r.status != http.StatusCreated {
			t.Fatalf("payment %d: %v", i, r)
		}
	}
	mustCreate(0)
	eventually(t, 60*time.Second, 50*time.Millisecond, "the first event booked and marked sent", func() (bool, error) {
		n, err := ledgerCount(cons)
		return n == 1 && queryInt(t, serveDB, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL") == 0, err
	})

	down.Store(true)
	const during = 30
	for i := 1; i <= during; i++ {
		mustCreate(i)
	}
	eventually(t, 30*time.Second, 50*time.Millisecond, "a failed publish counted", func() (bool, error) {
		n, err := srv.metric("idem_events_publish_failures_total")
		return n > 0, err
	})
	if n := queryInt(t, serveDB, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL"); n != during {
		t.Errorf("%d events unsent while the brokers refuse records, want %d", n, during)
	}
	if n := srv.mustMetric(t, "idem_events_pending"); n != during {
		t.Errorf("idem_events_pending = %v while the brokers refuse records, want %d", n, during)
	}
	if n, err := ledgerCount(cons); err != nil || n != 1 {
		t.Errorf("ledger count %d (%v) while the brokers refuse records, want 1", n, err)
	}

	down.Store(false)
	eventually(t, 90*time.Second, 100*time.Millisecond, "events delivered after the brokers returned", func() (bool, error) {
		n, err := ledgerCount(cons)
		return n == during+1, err
	})
	eventually(t, 30*time.Second, 50*time.Millisecond, "every event marked sent and committed", func() (bool, error) {
		if n := queryInt(t, serveDB, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL"); n != 0 {
			return false, fmt.Errorf("%d unsent", n)
		}
		return kf.Settled(context.Background())
	})
	if n, err := ledgerCount(cons); err != nil || n != during+1 {
		t.Errorf("ledger count %d (%v), want %d", n, err, during+1)
	}
}

// Every class of invalid event, produced straight to Kafka (one key, so
// one partition, in order): each is logged with its message id and why,
// counted, skipped with its offset committed, and never booked; an id
// reused with another payload (Kafka has no publisher-side window) is
// refused too.
func TestConsumeRefusesInvalidEventsKafka(t *testing.T) {
	t.Parallel()
	kf := newKafka(t)
	ctx := testContext(t)
	cl, err := kgo.NewClient(kgo.SeedBrokers(kf.c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := idemkafka.EnsureTopic(ctx, cl, kf.subject, &idemkafka.TopicConfig{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	publish := func(id string, payload []byte) {
		t.Helper()
		r := idemkafka.Record(outbox.Message{ID: id, Topic: kf.subject, Key: "one-partition", Payload: payload})
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	cons := testRefusesInvalidEvents(t, kf.URL(), kf.subject, publish, func(validID string) {
		publish(validID, eventPayload(strings.TrimPrefix(validID, events.TypePaymentCreated+":"), map[string]string{"amountCents": "1"}))
	})
	eventually(t, 30*time.Second, 50*time.Millisecond, "every offset committed", func() (bool, error) { return kf.Settled(ctx) })
	if n := cons.mustMetric(t, `idem_consume_refused_total{reason="reused_id"}`); n != 1 {
		t.Errorf("refused with a reused id: %v, want 1", n)
	}
}
