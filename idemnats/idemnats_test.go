package idemnats_test

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
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemnats"
	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const defaultNATSURL = "nats://127.0.0.1:4222"

func natsURL() string {
	if u := os.Getenv("IDEM_TEST_NATS_URL"); u != "" {
		return u
	}
	return defaultNATSURL
}

// connect connects to the test server, skipping the test when it is
// unreachable on a developer's machine and failing it in CI.
func connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(natsURL(), nats.Timeout(3*time.Second))
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("NATS at %s is unreachable (CI is set): %v", natsURL(), err)
		}
		u, _ := url.Parse(natsURL())
		t.Skipf("NATS at %s is unreachable: %v", u.Redacted(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// subject returns a subject of the test's own; its stream is deleted at
// the end.
func subject(t testing.TB, js jetstream.JetStream) string {
	t.Helper()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	s := "t" + hex.EncodeToString(b) + ".events.created"
	name, _ := idemnats.StreamFor(s)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", name, err)
		}
	})
	return s
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestPublisherDeduplicatesByID(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	subj := subject(t, js)
	ctx := ctxT(t)
	s, err := idemnats.EnsureStream(ctx, js, subj)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := idemnats.EnsureStream(ctx, js, subj); err != nil { // exists now
		t.Fatal(err)
	}
	p := idemnats.NewPublisher(js)
	msgs := []outbox.Message{
		{ID: "a", Topic: subj, Payload: []byte("1"), Headers: map[string]string{"Event-Type": "created"}},
		{ID: "b", Topic: subj, Payload: []byte("2")},
	}
	if errs := p.Publish(ctx, msgs); errs != nil {
		t.Fatal(errs)
	}
	if errs := p.Publish(ctx, msgs[:1]); errs != nil { // a re-publish after a crash
		t.Fatal(errs)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("the stream holds %d messages, want 2 (the copy of a dropped)", info.State.Msgs)
	}
	m, err := s.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Header.Get(jetstream.MsgIDHeader) != "a" || m.Header.Get("Event-Type") != "created" || string(m.Data) != "1" {
		t.Fatalf("stored message %+v", m)
	}
	// No stream for the subject: every message fails.
	if errs := p.Publish(ctx, []outbox.Message{{ID: "c", Topic: "nostream" + subj}}); len(errs) != 1 || errs[0] == nil {
		t.Fatalf("publish without a stream: %v", errs)
	}
}

// Consume books each message once through an inbox on SQLite: a failed
// handler's message is redelivered and booked once, a message an earlier
// delivery committed is acknowledged without running again, and a message
// without Nats-Msg-Id is deduplicated by its stream sequence.
func TestConsumeThroughInbox(t *testing.T) {
	t.Parallel()
	nc, js := connect(t)
	subj := subject(t, js)
	ctx := ctxT(t)
	cons, err := idemnats.EnsureConsumer(ctx, js, subj, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "in.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE booked (id TEXT NOT NULL, payload TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	exec, err := idem.NewExecutor(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(exec, inbox.Config{Name: idemnats.ConsumerFor(subj)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	failed := map[string]bool{}
	book := func(ctx context.Context, m inbox.Message) error {
		tx, err := sqlitestore.Tx(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO booked (id, payload) VALUES (?, ?)`, m.ID, string(m.Payload)); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if strings.HasSuffix(m.ID, "-7") && !failed[m.ID] {
			failed[m.ID] = true
			return errors.New("fails once, after writing") // rolled back
		}
		return nil
	}
	const n = 20
	// "m-3" was handled by an earlier delivery whose ack was lost.
	if a, _, err := in.Process(ctx, inbox.Message{ID: "m-3", Topic: subj, Payload: []byte("3")}, book); a != inbox.Ack || err != nil {
		t.Fatal(a, err)
	}
	p := idemnats.NewPublisher(js)
	var msgs []outbox.Message
	for i := range n {
		msgs = append(msgs, outbox.Message{ID: fmt.Sprint("m-", i), Topic: subj, Payload: []byte(fmt.Sprint(i))})
	}
	if errs := p.Publish(ctx, msgs); errs != nil {
		t.Fatal(errs)
	}
	if err := nc.Publish(subj, []byte("no id")); err != nil { // no Nats-Msg-Id
		t.Fatal(err)
	}
	handled := make(chan bool, 4*n)
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- idemnats.Consume(cctx, cons, in, book, &idemnats.ConsumeConfig{RetryDelay: 50 * time.Millisecond, OnHandled: func(ran bool) { handled <- ran }})
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
			t.Fatalf("%d handled, %d replays before the deadline", ran, replays)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ran != n || replays != 1 {
		t.Errorf("handler committed %d times and %d deliveries were replays; want %d and 1 (m-3)", ran, replays, n)
	}
	var rows, distinct int
	if err := st.ReadDB().QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT id) FROM booked`).Scan(&rows, &distinct); err != nil {
		t.Fatal(err)
	}
	if rows != n+1 || distinct != n+1 {
		t.Errorf("%d booked rows (%d distinct), want %d", rows, distinct, n+1)
	}
	var id string
	if err := st.ReadDB().QueryRowContext(ctx, `SELECT id FROM booked WHERE payload = 'no id'`).Scan(&id); err != nil || !strings.HasPrefix(id, "stream:") {
		t.Errorf("message without Nats-Msg-Id booked as %q (%v), want its stream sequence", id, err)
	}
}

// A consumer deleted while Consume runs: with ConsumerFunc, Consume
// creates it again and handles the later messages; without it, Consume
// returns an error instead of waiting for heartbeats forever.
func TestConsumeRecreatesDeletedConsumer(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	subj := subject(t, js)
	ctx := ctxT(t)
	cfg := &idemnats.ConsumerConfig{AckWait: 2 * time.Second}
	ensure := func(ctx context.Context) (jetstream.Consumer, error) {
		return idemnats.EnsureConsumerConfig(ctx, js, subj, cfg)
	}
	cons, err := ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "in.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	exec, err := idem.NewExecutor(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(exec, inbox.Config{Name: idemnats.ConsumerFor(subj)})
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan string, 100)
	h := func(_ context.Context, m inbox.Message) error { handled <- m.ID; return nil }
	p := idemnats.NewPublisher(js)
	publish := func(id string) {
		t.Helper()
		if errs := p.Publish(ctx, []outbox.Message{{ID: id, Topic: subj, Payload: []byte(id)}}); errs != nil {
			t.Fatal(errs)
		}
	}
	expect := func(id string) {
		t.Helper()
		select {
		case got := <-handled:
			if got != id {
				t.Fatalf("handled %s, want %s", got, id)
			}
		case <-ctx.Done():
			t.Fatalf("%s not handled", id)
		}
	}
	stream, _ := idemnats.StreamFor(subj)

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- idemnats.Consume(cctx, cons, in, h, &idemnats.ConsumeConfig{PullExpiry: time.Second, ConsumerFunc: ensure})
	}()
	publish("a")
	expect("a")
	if err := js.DeleteConsumer(ctx, stream, idemnats.ConsumerFor(subj)); err != nil {
		t.Fatal(err)
	}
	publish("b") // the re-created consumer delivers the whole stream: a is a replay
	expect("b")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Without ConsumerFunc.
	cons, err = ensure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- idemnats.Consume(ctx, cons, in, h, &idemnats.ConsumeConfig{PullExpiry: time.Second}) }()
	publish("c")
	expect("c")
	if err := js.DeleteConsumer(ctx, stream, idemnats.ConsumerFor(subj)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Consume returned nil after its consumer was deleted")
		}
	case <-ctx.Done():
		t.Fatal("Consume did not return after its consumer was deleted")
	}
}

// EnsureConsumerConfig keeps an existing consumer's start and delivery
// policy (they cannot be updated) and updates its AckWait; StartFunc is
// asked only when the consumer is created.
func TestEnsureConsumerKeepsPosition(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	subj := subject(t, js)
	ctx := ctxT(t)
	start := time.Now().Add(-time.Hour).Truncate(time.Second)
	asked := 0
	cons, err := idemnats.EnsureConsumerConfig(ctx, js, subj, &idemnats.ConsumerConfig{AckWait: 3 * time.Second,
		StartFunc: func(context.Context) (time.Time, error) { asked++; return start, nil }})
	if err != nil {
		t.Fatal(err)
	}
	info := cons.CachedInfo()
	if info.Config.DeliverPolicy != jetstream.DeliverByStartTimePolicy || info.Config.OptStartTime == nil || !info.Config.OptStartTime.Equal(start) {
		t.Fatalf("created consumer %+v, want one starting at %v", info.Config, start)
	}
	cons, err = idemnats.EnsureConsumer(ctx, js, subj, 7*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	info = cons.CachedInfo()
	if info.Config.DeliverPolicy != jetstream.DeliverByStartTimePolicy || !info.Config.OptStartTime.Equal(start) || asked != 1 {
		t.Fatalf("ensured again: %+v (StartFunc asked %d times)", info.Config, asked)
	}
	// A consumer that delivers the whole stream gets the new AckWait.
	all := subject(t, js)
	if _, err := idemnats.EnsureConsumer(ctx, js, all, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	if cons, err = idemnats.EnsureConsumer(ctx, js, all, 7*time.Second); err != nil || cons.CachedInfo().Config.AckWait != 7*time.Second {
		t.Fatalf("AckWait not updated: %v", err)
	}
	_, err = idemnats.EnsureConsumerConfig(ctx, js, subject(t, js), &idemnats.ConsumerConfig{StartFunc: func(context.Context) (time.Time, error) {
		return time.Time{}, errors.New("no ledger")
	}})
	if err == nil || !strings.Contains(err.Error(), "no ledger") {
		t.Fatalf("StartFunc's error: %v", err)
	}
}
