package idemkafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemkafka"
	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// cluster starts an in-process Kafka cluster (kfake: the Kafka protocol on
// real loopback ports) with one broker, stopped by the test's cleanup.
func cluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// clientOpts are the options every test client has: the cluster's
// address, and metadata refreshed often enough for tests that delete
// topics.
func clientOpts(c *kfake.Cluster, extra ...kgo.Opt) []kgo.Opt {
	return append([]kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.MetadataMinAge(50 * time.Millisecond), kgo.MetadataMaxAge(time.Second)}, extra...)
}

// client returns a client of c, closed by the test's cleanup.
func client(t testing.TB, c *kfake.Cluster, extra ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(clientOpts(c, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// createTopic creates topic with the given partitions.
func createTopic(t testing.TB, cl *kgo.Client, topic string, partitions int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	created, err := idemkafka.EnsureTopic(ctx, cl, topic, &idemkafka.TopicConfig{Partitions: partitions})
	if err != nil || !created {
		t.Fatalf("create topic %s: created %v, %v", topic, created, err)
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// ledger is a consumer's SQLite file: the inbox records and a booked
// table the handler writes through the inbox's transaction. The table has
// no unique constraint: that each message is booked once is the inbox's
// doing.
type ledger struct {
	st *sqlitestore.Store
	in *inbox.Inbox

	mu       sync.Mutex
	failOnce map[string]bool // ids whose first booking fails after writing
	// delay makes each booking take this long (slow work, so that
	// rebalances land while records are handled).
	delay time.Duration
}

func newLedger(t testing.TB, name string) *ledger {
	t.Helper()
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "ledger.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE booked (id TEXT NOT NULL, payload TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	exec, err := idem.NewExecutor(st, &idem.Config{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(exec, inbox.Config{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return &ledger{st: st, in: in, failOnce: map[string]bool{}}
}

// book is the inbox handler: one row per handled message.
func (l *ledger) book(ctx context.Context, m inbox.Message) error {
	if l.delay > 0 {
		tm := time.NewTimer(l.delay)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			return ctx.Err()
		}
	}
	tx, err := sqlitestore.Tx(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO booked (id, payload) VALUES (?, ?)`, m.ID, string(m.Payload)); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.failOnce[m.ID]; ok && !f {
		l.failOnce[m.ID] = true
		return fmt.Errorf("fails once, after writing %s", m.ID) // rolled back
	}
	return nil
}

// counts returns the booked rows and distinct ids.
func (l *ledger) counts(t testing.TB) (rows, distinct int) {
	t.Helper()
	if err := l.st.ReadDB().QueryRow(`SELECT COUNT(*), COUNT(DISTINCT id) FROM booked`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	return rows, distinct
}

// bookedCount returns how many rows id has.
func (l *ledger) bookedCount(t testing.TB, id string) int {
	t.Helper()
	var n int
	if err := l.st.ReadDB().QueryRow(`SELECT COUNT(*) FROM booked WHERE id = ?`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// consumer runs idemkafka.Consume in a goroutine; stop ends it and
// returns its error.
type consumer struct {
	cancel  context.CancelFunc
	done    chan error
	handled chan bool
	dropped chan string
	// nReplays counts the replays collect and replays saw.
	nReplays int
}

func startConsumer(t testing.TB, c *kfake.Cluster, group, topic string, l *ledger, cfg *idemkafka.ConsumeConfig) *consumer {
	t.Helper()
	if cfg == nil {
		cfg = &idemkafka.ConsumeConfig{}
	}
	k := &consumer{done: make(chan error, 1), handled: make(chan bool, 10_000), dropped: make(chan string, 100)}
	cfg.RetryDelay = 50 * time.Millisecond
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	cfg.OnHandled = func(ran bool) { k.handled <- ran }
	cfg.OnDropped = func(m inbox.Message, _ error) { k.dropped <- m.ID }
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	g := idemkafka.Group{Name: group, Topics: []string{topic}, ClientOpts: clientOpts(c, kgo.SessionTimeout(6*time.Second), kgo.HeartbeatInterval(500*time.Millisecond))}
	go func() { k.done <- idemkafka.Consume(ctx, g, l.in, l.book, cfg) }()
	t.Cleanup(func() { k.stop(t) })
	return k
}

// stop ends the consumer and returns Consume's error.
func (k *consumer) stop(t testing.TB) error {
	t.Helper()
	k.cancel()
	return k.wait(t, context.Background())
}

// wait waits until Consume returned (at most 30 seconds, or ctx), and
// returns its error. Later calls return nil.
func (k *consumer) wait(t testing.TB, ctx context.Context) error {
	t.Helper()
	tm := time.NewTimer(30 * time.Second)
	defer tm.Stop()
	select {
	case err, ok := <-k.done:
		if !ok {
			return nil
		}
		close(k.done)
		return err
	case <-tm.C:
	case <-ctx.Done():
	}
	t.Fatal("Consume did not return")
	return nil
}

// collect collects n handled records (ran, replays) or fails at ctx's
// end.
func (k *consumer) collect(t testing.TB, ctx context.Context, n int) (ran, replays int) {
	t.Helper()
	for ran+replays < n {
		select {
		case r := <-k.handled:
			k.count(r)
			if r {
				ran++
			} else {
				replays++
			}
		case <-ctx.Done():
			t.Fatalf("%d handled, %d replays of %d before the deadline", ran, replays, n)
		}
	}
	return ran, replays
}

// replays drains the handled records and returns how many replays the
// consumer has reported so far.
func (k *consumer) replays() int {
	for {
		select {
		case r := <-k.handled:
			k.count(r)
		default:
			return k.nReplays
		}
	}
}

func (k *consumer) count(ran bool) {
	if !ran {
		k.nReplays++
	}
}

// publish publishes msgs through a Publisher on cl and fails the test on
// any error.
func publish(t testing.TB, ctx context.Context, p *idemkafka.Publisher, msgs ...outbox.Message) {
	t.Helper()
	if errs := p.Publish(ctx, msgs); errs != nil {
		t.Fatal(errs)
	}
}

func messages(topic, prefix string, n int) []outbox.Message {
	msgs := make([]outbox.Message, n)
	for i := range msgs {
		msgs[i] = outbox.Message{ID: fmt.Sprint(prefix, i), Topic: topic, Payload: []byte(fmt.Sprint(i))}
	}
	return msgs
}

// readAll reads every record of topic (all partitions, from the start)
// with a plain consumer, until it has n.
func readAll(t testing.TB, ctx context.Context, c *kfake.Cluster, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := client(t, c, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var rs []*kgo.Record
	for len(rs) < n {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records before the deadline", len(rs), n)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Logf("fetch %s/%d: %v", topic, p, err) })
		rs = append(rs, fs.Records()...)
	}
	cl.Close()
	return rs
}

// committed returns group's committed offsets of topic by partition.
func committed(c *kfake.Cluster, group, topic string) map[int32]int64 {
	gi := c.GroupInfo(group)
	out := map[int32]int64{}
	if gi == nil {
		return out
	}
	for p, cm := range gi.Commits[topic] {
		out[p] = cm.Offset
	}
	return out
}

// endOffsets returns topic's high watermarks by partition, for the
// partitions that hold records (a group commits nothing for the others).
func endOffsets(c *kfake.Cluster, topic string) map[int32]int64 {
	out := map[int32]int64{}
	for _, pi := range c.PartitionInfos(topic) {
		if pi.HighWatermark > 0 {
			out[pi.Partition] = pi.HighWatermark
		}
	}
	return out
}

// commitAuditor checks every offset commit the cluster receives for
// group: a committed offset O of a partition means every record before O
// is booked in l (its inbox record and row committed). It records the
// first violation.
type commitAuditor struct {
	mu        sync.Mutex
	ids       map[int32]map[int64]string // partition -> offset -> message id
	violation string
	commits   int
}

// audit installs the auditor on c. ids maps each record (partition,
// offset) to its message id; records it does not know are not checked.
func audit(c *kfake.Cluster, l *ledger, group string, ids map[int32]map[int64]string) *commitAuditor {
	a := &commitAuditor{ids: ids}
	c.ControlKey(int16(kmsg.OffsetCommit), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		r := req.(*kmsg.OffsetCommitRequest)
		if r.Group != group {
			return nil, nil, false
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.commits++
		for _, tp := range r.Topics {
			for _, p := range tp.Partitions {
				for off, id := range a.ids[p.Partition] {
					if off < p.Offset && l.bookedCountNoT(id) == 0 && a.violation == "" {
						a.violation = fmt.Sprintf("partition %d committed at %d, but %s (offset %d) is not booked", p.Partition, p.Offset, id, off)
					}
				}
			}
		}
		return nil, nil, false // the cluster handles the commit
	})
	return a
}

func (a *commitAuditor) check(t testing.TB) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.violation != "" {
		t.Errorf("an offset was committed before the inbox commit: %s", a.violation)
	}
	if a.commits == 0 {
		t.Error("no offset commit was audited")
	}
}

func (l *ledger) bookedCountNoT(id string) int {
	var n int
	if err := l.st.ReadDB().QueryRow(`SELECT COUNT(*) FROM booked WHERE id = ?`, id).Scan(&n); err != nil {
		return -1
	}
	return n
}

// produce produces msgs and returns each record's (partition, offset) →
// message id, for audit.
func produce(t testing.TB, ctx context.Context, cl *kgo.Client, msgs []outbox.Message) map[int32]map[int64]string {
	t.Helper()
	ids := map[int32]map[int64]string{}
	for _, m := range msgs {
		r := idemkafka.Record(m)
		if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if ids[r.Partition] == nil {
			ids[r.Partition] = map[int64]string{}
		}
		ids[r.Partition][r.Offset] = m.ID
	}
	return ids
}
