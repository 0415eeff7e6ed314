package idemkafka_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemkafka"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/idemhq/idem/sqlitestore/sqliteoutbox"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func TestNewPublisherRequiresIdempotentAllAcks(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	for name, opts := range map[string][]kgo.Opt{
		"leader acks":    {kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite()},
		"not idempotent": {kgo.DisableIdempotentWrite()},
		"transactional":  {kgo.TransactionalID("tx")},
	} {
		if _, err := idemkafka.NewPublisher(client(t, c, opts...)); err == nil {
			t.Errorf("%s: NewPublisher accepted the client", name)
		}
	}
	if _, err := idemkafka.NewPublisher(nil); err == nil {
		t.Error("NewPublisher accepted a nil client")
	}
	if _, err := idemkafka.NewPublisher(client(t, c)); err != nil {
		t.Errorf("the default client: %v", err)
	}
}

// A published message is one record: key, value, the id header first,
// then the message's headers sorted; a message header named like the id
// header does not replace the id.
func TestPublishRecord(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	ctx := ctxT(t)
	cl := client(t, c)
	createTopic(t, cl, "events", 3)
	if created, err := idemkafka.EnsureTopic(ctx, cl, "events", nil); err != nil || created {
		t.Fatalf("EnsureTopic of an existing topic: created %v, %v", created, err)
	}
	p, err := idemkafka.NewPublisher(cl)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, p,
		outbox.Message{ID: "a", Topic: "events", Key: "k", Payload: []byte("1"),
			Headers: map[string]string{"Event-Type": "created", "Content-Type": "application/json", idemkafka.MessageIDHeader: "forged"}},
		outbox.Message{ID: "b", Topic: "events", Payload: []byte("2")})
	rs := readAll(t, ctx, c, "events", 2)
	byID := map[string]*kgo.Record{}
	for _, r := range rs {
		byID[idemkafka.Message(r).ID] = r
	}
	a, b := byID["a"], byID["b"]
	if a == nil || b == nil {
		t.Fatalf("records %v", rs)
	}
	var hs []string
	for _, h := range a.Headers {
		hs = append(hs, h.Key+"="+string(h.Value))
	}
	if got := strings.Join(hs, " "); got != "Idem-Msg-Id=a Content-Type=application/json Event-Type=created" {
		t.Errorf("headers %q", got)
	}
	if string(a.Key) != "k" || string(a.Value) != "1" || b.Key != nil || string(b.Value) != "2" {
		t.Errorf("records %+v, %+v", a, b)
	}
	// A topic that does not exist: the message fails.
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if errs := p.Publish(sctx, []outbox.Message{{ID: "c", Topic: "missing"}}); len(errs) != 1 || errs[0] == nil {
		t.Errorf("publish to a missing topic: %v", errs)
	}
}

// A dispatcher draining a SQLite outbox keeps each key's messages in
// order on one partition, while the keys spread over the partitions.
func TestOrderPerKeyAcrossPartitions(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	ctx := ctxT(t)
	cl := client(t, c, kgo.RecordDeliveryTimeout(10*time.Second))
	createTopic(t, cl, "orders", 6)
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "o.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ob, err := sqliteoutbox.New(st.DB(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	exec, err := idem.NewExecutor(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	// 20 keys, 25 messages each, added interleaved in random order in
	// transactions of 10.
	const keys, each = 20, 25
	var msgs []outbox.Message
	for k := range keys {
		for i := range each {
			msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("k%d-%d", k, i), Topic: "orders", Key: fmt.Sprint("k", k)})
		}
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	seq := map[string]int{}
	for i := range msgs {
		msgs[i].Payload = []byte(fmt.Sprint(seq[msgs[i].Key])) // the key's n-th message
		seq[msgs[i].Key]++
	}
	for i := 0; i < len(msgs); i += 10 {
		if _, err := exec.Do(ctx, idem.DoParams{Scope: "fill", Key: fmt.Sprint(i), Fingerprint: "f"}, func(ctx context.Context) (*idem.Response, error) {
			return &idem.Response{StatusCode: 200}, ob.Add(ctx, msgs[i:i+10]...)
		}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := idemkafka.NewPublisher(cl)
	if err != nil {
		t.Fatal(err)
	}
	d, err := outbox.NewDispatcher(ob, p, &outbox.Config{BatchSize: 50})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := d.RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if n, err := ob.Pending(ctx); err != nil || n == 0 {
			break
		}
	}
	rs := readAll(t, ctx, c, "orders", keys*each)
	partitionOf := map[string]int32{}
	nextOf := map[string]int{}
	used := map[int32]bool{}
	for _, r := range rs { // in offset order per partition
		k := string(r.Key)
		if p, ok := partitionOf[k]; ok && p != r.Partition {
			t.Fatalf("key %s on partitions %d and %d", k, p, r.Partition)
		}
		partitionOf[k] = r.Partition
		used[r.Partition] = true
		if got := string(r.Value); got != fmt.Sprint(nextOf[k]) {
			t.Fatalf("key %s: message %s where %d was next", k, got, nextOf[k])
		}
		nextOf[k]++
	}
	if len(rs) != keys*each || len(used) < 3 {
		t.Errorf("%d records on %d partitions, want %d on at least 3", len(rs), len(used), keys*each)
	}
}

// A broker that accepts the produce request and never answers: Publish
// returns when its context ends, with every message failed.
func TestStalledBrokerBoundsPublish(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	ctx := ctxT(t)
	cl := client(t, c)
	createTopic(t, cl, "slow", 1)
	p, err := idemkafka.NewPublisher(cl)
	if err != nil {
		t.Fatal(err)
	}
	stalled := make(chan struct{}, 1)
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		select {
		case stalled <- struct{}{}:
		default:
		}
		return nil, nil, true // read, never answered
	})
	pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs := p.Publish(pctx, messages("slow", "m", 5))
	took := time.Since(start)
	if len(errs) != 5 {
		t.Fatalf("errors %v", errs)
	}
	for _, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "no acknowledgement") {
			t.Errorf("error %v", err)
		}
	}
	if took > 3*time.Second {
		t.Errorf("Publish took %v with a 500ms context", took)
	}
	select {
	case <-stalled:
	default:
		t.Error("no produce request reached the broker")
	}
}

// The brokers gone (the cluster closed): Publish still returns when its
// context ends.
func TestUnreachableBrokerBoundsPublish(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	ctx := ctxT(t)
	cl := client(t, c)
	createTopic(t, cl, "gone", 1)
	p, err := idemkafka.NewPublisher(cl)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, p, messages("gone", "a", 1)...)
	c.Close()
	pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	errs := p.Publish(pctx, messages("gone", "b", 3))
	if took := time.Since(start); took > 3*time.Second || len(errs) != 3 || errs[0] == nil {
		t.Errorf("Publish took %v and returned %v", took, errs)
	}
}
