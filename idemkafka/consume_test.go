package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/idemkafka"
	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/outbox"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Consume books each record once through an inbox on SQLite: a failed
// booking is retried in place and booked once, a message an earlier
// delivery booked is a replay, a record without the id header is
// deduplicated by its partition and offset, a record with an unusable id is
// skipped and reported; and the offsets end committed at the end of each
// partition.
func TestConsumeThroughInbox(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	ctx := ctxT(t)
	cl := client(t, c)
	createTopic(t, cl, "events", 4)
	l := newLedger(t, "events")
	l.failOnce["m-7"] = false
	// m-3 was booked by an earlier delivery whose commit was lost.
	if a, _, err := l.in.Process(ctx, inbox.Message{ID: "m-3", Topic: "events", Payload: []byte("3")}, l.book); a != inbox.Ack || err != nil {
		t.Fatal(a, err)
	}
	p, err := idemkafka.NewPublisher(cl)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	publish(t, ctx, p, messages("events", "m-", n)...)
	publish(t, ctx, p, messages("events", "m-", 1)...) // m-0 again: a re-publish
	// A record from another producer, without the id header, and one
	// whose id cannot be an idempotency key.
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "events", Value: []byte("no id")},
		&kgo.Record{Topic: "events", Value: []byte("bad id"), Headers: []kgo.RecordHeader{{Key: idemkafka.MessageIDHeader, Value: []byte(strings.Repeat("x", 300))}}},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	k := startConsumer(t, c, "g", "events", l, nil)
	ran, replays := k.collect(t, ctx, n+2) // m-0..m-19, m-0's copy, "no id"
	select {
	case id := <-k.dropped:
		if len(id) != 300 {
			t.Errorf("dropped %q", id)
		}
	case <-ctx.Done():
		t.Fatal("the record with an unusable id was not dropped")
	}
	if err := k.stop(t); err != nil {
		t.Fatal(err)
	}
	if ran != n || replays != 2 {
		t.Errorf("booked %d times and %d replays; want %d (19 and \"no id\") and 2 (m-0's copy, m-3)", ran, replays, n)
	}
	if rows, distinct := l.counts(t); rows != n+1 || distinct != n+1 {
		t.Errorf("%d booked rows (%d distinct), want %d", rows, distinct, n+1)
	}
	var id string
	if err := l.st.ReadDB().QueryRow(`SELECT id FROM booked WHERE payload = 'no id'`).Scan(&id); err != nil || !strings.HasPrefix(id, "kafka:events:") {
		t.Errorf("record without %s booked as %q (%v)", idemkafka.MessageIDHeader, id, err)
	}
	if got, want := committed(c, "g", "events"), endOffsets(c, "events"); !maps.Equal(got, want) {
		t.Errorf("committed %v, want the end offsets %v", got, want)
	}
}

// A consumer killed after the inbox committed a record and before the
// record's offset was committed: the next consumer reads it again and the
// inbox acknowledges it as a replay. Every commit the cluster receives is
// audited: none is past a record that is not booked.
func TestCrashBetweenInboxCommitAndOffsetCommit(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	ctx := ctxT(t)
	cl := client(t, c)
	createTopic(t, cl, "events", 2)
	l := newLedger(t, "events")
	const n = 40
	ids := produce(t, ctx, cl, messages("events", "m-", n))
	a := audit(c, l, "g", ids)
	k := startConsumer(t, c, "g", "events", l, idemkafka.WithHooks(&idemkafka.ConsumeConfig{}, idemkafka.Hooks{
		AfterProcess: func(m inbox.Message) bool { return m.ID == "m-25" },
	}))
	if err := k.wait(t, ctx); !errors.Is(err, idemkafka.ErrCrashed) {
		t.Fatalf("Consume returned %v, want the crash", err)
	}
	if l.bookedCount(t, "m-25") != 1 {
		t.Fatal("m-25 was not booked before the crash")
	}
	if committedOf(c, "g", "events", ids, "m-25") {
		t.Fatal("m-25's offset was committed before the crash")
	}
	k = startConsumer(t, c, "g", "events", l, nil)
	waitCommitted(t, ctx, c, "g", "events")
	if err := k.stop(t); err != nil {
		t.Fatal(err)
	}
	if rows, distinct := l.counts(t); rows != n || distinct != n {
		t.Errorf("%d booked rows (%d distinct), want %d", rows, distinct, n)
	}
	if k.replays() == 0 {
		t.Error("no replay after the crash: m-25 was not read again")
	}
	a.check(t)
}

// committedOf reports whether id's offset is below group's committed
// offset of its partition.
func committedOf(c *kfake.Cluster, group, topic string, ids map[int32]map[int64]string, id string) bool {
	got := committed(c, group, topic)
	for p, offs := range ids {
		for off, mid := range offs {
			if mid == id {
				return got[p] > off
			}
		}
	}
	return false
}

// The wrong order, on purpose: a consumer that commits a record's offset
// before the inbox commit and dies in between loses the record; the same
// crash with the offset committed after the inbox commit loses nothing.
// This is what the commit order is for.
func TestCommitBeforeInboxCommitLosesTheRecord(t *testing.T) {
	t.Parallel()
	for _, commitFirst := range []bool{true, false} {
		t.Run(fmt.Sprint("commitFirst=", commitFirst), func(t *testing.T) {
			t.Parallel()
			c := cluster(t)
			ctx := ctxT(t)
			cl := client(t, c)
			createTopic(t, cl, "events", 1)
			l := newLedger(t, "events")
			const n = 10
			produce(t, ctx, cl, messages("events", "m-", n))
			k := startConsumer(t, c, "g", "events", l, idemkafka.WithHooks(&idemkafka.ConsumeConfig{}, idemkafka.Hooks{
				CommitFirst:   commitFirst,
				BeforeProcess: func(m inbox.Message) bool { return m.ID == "m-5" },
			}))
			if err := k.wait(t, ctx); !errors.Is(err, idemkafka.ErrCrashed) {
				t.Fatalf("Consume returned %v, want the crash", err)
			}
			// The restarted consumer reads from the committed offset.
			k = startConsumer(t, c, "g", "events", l, nil)
			waitCommitted(t, ctx, c, "g", "events")
			if err := k.stop(t); err != nil {
				t.Fatal(err)
			}
			booked := l.bookedCount(t, "m-5")
			rows, distinct := l.counts(t)
			if commitFirst {
				if booked != 0 || rows != n-1 || distinct != n-1 {
					t.Errorf("committing first: m-5 booked %d times, %d rows (%d distinct); want m-5 lost and %d rows", booked, rows, distinct, n-1)
				}
				return
			}
			if booked != 1 || rows != n || distinct != n {
				t.Errorf("committing after the inbox: m-5 booked %d times, %d rows (%d distinct); want 1 and %d", booked, rows, distinct, n)
			}
		})
	}
}

// waitCommitted waits until group's committed offsets of topic are the
// topic's end offsets.
func waitCommitted(t testing.TB, ctx context.Context, c *kfake.Cluster, group, topic string) {
	t.Helper()
	for {
		got, want := committed(c, group, topic), endOffsets(c, topic)
		if maps.Equal(got, want) {
			return
		}
		if !sleepCtx(ctx, 20*time.Millisecond) {
			t.Fatalf("committed %v, want the end offsets %v", got, want)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Two consumers share a group while records are handled: the rebalances
// (the second joining, then the first leaving) move partitions between
// them, each revoke commits what was booked on the revoked partitions,
// and every record ends booked once. Every commit is audited.
func TestRebalanceBooksOnce(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	ctx := ctxT(t)
	cl := client(t, c)
	createTopic(t, cl, "events", 4)
	l := newLedger(t, "events")
	l.delay = 2 * time.Millisecond // slow bookings: the rebalances land mid-poll
	const n = 400
	msgs := messages("events", "m-", n)
	for i := range msgs {
		msgs[i].Key = fmt.Sprint("k", i) // spread over the partitions
	}
	ids := produce(t, ctx, cl, msgs)
	if len(ids) != 4 {
		t.Fatalf("records on %d partitions, want 4", len(ids))
	}
	a := audit(c, l, "g", ids)
	first := startConsumer(t, c, "g", "events", l, nil)
	first.collect(t, ctx, 50)
	second := startConsumer(t, c, "g", "events", l, nil)
	second.collect(t, ctx, 20) // the second has partitions of its own
	if err := first.stop(t); err != nil {
		t.Fatal(err)
	}
	waitCommitted(t, ctx, c, "g", "events")
	if err := second.stop(t); err != nil {
		t.Fatal(err)
	}
	if rows, distinct := l.counts(t); rows != n || distinct != n {
		t.Errorf("%d booked rows (%d distinct), want %d", rows, distinct, n)
	}
	a.check(t)
	t.Logf("replays: %d by the first consumer, %d by the second", first.replays(), second.replays())
}

// A topic deleted and created again while Consume runs: the consumer
// reads the new topic from its start and books its records; nothing has
// to be re-created by hand.
func TestConsumeTopicRecreated(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	ctx := ctxT(t)
	cl := client(t, c)
	createTopic(t, cl, "events", 1)
	l := newLedger(t, "events")
	p, err := idemkafka.NewPublisher(cl)
	if err != nil {
		t.Fatal(err)
	}
	k := startConsumer(t, c, "g", "events", l, nil)
	publish(t, ctx, p, messages("events", "a", 1)...)
	k.collect(t, ctx, 1)
	if err := c.DeleteTopic("events"); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTopic("events", 1, nil); err != nil {
		t.Fatal(err)
	}
	// The producer learns about the new topic with its metadata.
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		errs := p.Publish(pctx, messages("events", "b", 1))
		cancel()
		if errs == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("publish to the new topic: %v", errs)
		}
	}
	if ran, _ := k.collect(t, ctx, 1); ran != 1 {
		t.Fatal("b was not booked")
	}
	if err := k.stop(t); err != nil {
		t.Fatal(err)
	}
	if l.bookedCount(t, "a0") != 1 || l.bookedCount(t, "b0") != 1 {
		t.Errorf("a0 booked %d times, b0 %d, want once each", l.bookedCount(t, "a0"), l.bookedCount(t, "b0"))
	}
}

// A group whose offsets are gone (deleted while it had no members; Kafka
// also expires them): with StartFunc the consumer starts at the given
// time instead of the start of the topic, so records older than its
// deduplication window are not read again.
func TestConsumeStartFuncAfterGroupLost(t *testing.T) {
	t.Parallel()
	c := cluster(t)
	ctx := ctxT(t)
	cl := client(t, c)
	createTopic(t, cl, "events", 1)
	old := time.Now().Add(-time.Hour)
	for _, m := range messages("events", "old-", 3) {
		r := idemkafka.Record(m)
		r.Timestamp = old
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	l := newLedger(t, "events")
	k := startConsumer(t, c, "g", "events", l, nil)
	k.collect(t, ctx, 3)
	waitCommitted(t, ctx, c, "g", "events")
	if err := k.stop(t); err != nil {
		t.Fatal(err)
	}
	deleteGroup(t, ctx, cl, "g")
	p, err := idemkafka.NewPublisher(cl)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, p, messages("events", "new-", 1)...)
	for _, withStart := range []bool{true, false} {
		var cfg idemkafka.ConsumeConfig
		if withStart {
			cfg.StartFunc = func(context.Context) (time.Time, error) { return time.Now().Add(-30 * time.Minute), nil }
		}
		k := startConsumer(t, c, "g", "events", l, &cfg)
		waitCommitted(t, ctx, c, "g", "events")
		if err := k.stop(t); err != nil {
			t.Fatal(err)
		}
		ran, replays := k.collect(t, ctx, 0)
		for more := true; more; {
			select {
			case r := <-k.handled:
				if r {
					ran++
				} else {
					replays++
				}
			default:
				more = false
			}
		}
		switch {
		case withStart && (ran != 1 || replays != 0):
			t.Errorf("with StartFunc: %d booked and %d replays, want only new-0 booked", ran, replays)
		case !withStart && (ran != 0 || replays != 4):
			t.Errorf("without StartFunc: %d booked and %d replays, want the whole topic replayed (4)", ran, replays)
		}
		deleteGroup(t, ctx, cl, "g")
	}
	if rows, distinct := l.counts(t); rows != 4 || distinct != 4 {
		t.Errorf("%d rows (%d distinct), want 4", rows, distinct)
	}
	// A StartFunc that fails stops Consume with its error.
	err = idemkafka.Consume(ctx, idemkafka.Group{Name: "g", Topics: []string{"events"}, ClientOpts: clientOpts(c)}, l.in, l.book,
		&idemkafka.ConsumeConfig{StartFunc: func(context.Context) (time.Time, error) { return time.Time{}, errors.New("no ledger") }})
	if err == nil || !strings.Contains(err.Error(), "no ledger") {
		t.Errorf("Consume with a failing StartFunc: %v", err)
	}
}

// deleteGroup deletes an empty group (and its committed offsets).
func deleteGroup(t testing.TB, ctx context.Context, cl *kgo.Client, group string) {
	t.Helper()
	req := kmsg.NewPtrDeleteGroupsRequest()
	req.Groups = []string{group}
	resp, err := req.RequestWith(ctx, cl)
	if err == nil && len(resp.Groups) == 1 {
		err = kerr.ErrorForCode(resp.Groups[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("delete group %s: %v", group, err)
	}
}

func TestConsumeRefusesBadArguments(t *testing.T) {
	t.Parallel()
	l := newLedger(t, "x")
	ctx := ctxT(t)
	for name, g := range map[string]idemkafka.Group{
		"no name":   {Topics: []string{"t"}},
		"no topics": {Name: "g"},
	} {
		if err := idemkafka.Consume(ctx, g, l.in, l.book, nil); err == nil {
			t.Errorf("%s: Consume returned nil", name)
		}
	}
	if err := idemkafka.Consume(ctx, idemkafka.Group{Name: "g", Topics: []string{"t"}}, l.in, l.book, &idemkafka.ConsumeConfig{RetryDelay: -1}); err == nil {
		t.Error("a negative RetryDelay was accepted")
	}
}

func TestMessage(t *testing.T) {
	t.Parallel()
	r := &kgo.Record{Topic: "t", Partition: 2, Offset: 9, Value: []byte("v"), Headers: []kgo.RecordHeader{
		{Key: "A", Value: []byte("1")}, {Key: "A", Value: []byte("2")}, {Key: idemkafka.MessageIDHeader, Value: []byte("id-1")},
	}}
	m := idemkafka.Message(r)
	if m.ID != "id-1" || m.Topic != "t" || string(m.Payload) != "v" || m.Headers["A"] != "1" || len(m.Headers) != 2 {
		t.Errorf("message %+v", m)
	}
	r.Headers = nil
	if m := idemkafka.Message(r); m.ID != "kafka:t:2:9" || m.Headers != nil {
		t.Errorf("message without the id header: %+v", m)
	}
	// The round trip through Record.
	back := idemkafka.Message(idemkafka.Record(outbox.Message{ID: "x", Topic: "t", Payload: []byte("p"), Headers: map[string]string{"H": "h"}}))
	if back.ID != "x" || back.Headers["H"] != "h" || string(back.Payload) != "p" {
		t.Errorf("round trip %+v", back)
	}
}

// The cluster stopped and started again on the same port with its data
// directory (a broker restart): the publisher and the consumer reconnect
// and rejoin on their own, the later records are booked, and none twice.
func TestConsumeAcrossBrokerRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DataDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(first.Close)
	_, port, _ := strings.Cut(first.ListenAddrs()[0], ":")
	ctx := ctxT(t)
	cl := client(t, first)
	createTopic(t, cl, "events", 2)
	p, err := idemkafka.NewPublisher(cl)
	if err != nil {
		t.Fatal(err)
	}
	l := newLedger(t, "events")
	k := startConsumer(t, first, "g", "events", l, nil)
	publish(t, ctx, p, messages("events", "a", 5)...)
	k.collect(t, ctx, 5)
	first.Close()

	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	second := cluster(t, kfake.DataDir(dir), kfake.Ports(n))
	// Publish until the restarted broker takes the records.
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		errs := p.Publish(pctx, messages("events", "b", 5))
		cancel()
		if errs == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("publish after the restart: %v", errs)
		}
	}
	waitCommitted(t, ctx, second, "g", "events")
	if err := k.stop(t); err != nil {
		t.Fatal(err)
	}
	if rows, distinct := l.counts(t); rows != 10 || distinct != 10 {
		t.Errorf("%d rows (%d distinct), want 10", rows, distinct)
	}
}
