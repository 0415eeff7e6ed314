package sqliteoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/idemhq/idem/sqlitestore/sqliteoutbox"
)

// recorder is an outbox.Publisher that records what it was given, and can
// be made to fail like a broker that is down.
type recorder struct {
	mu   sync.Mutex
	log  []outbox.Message
	down atomic.Bool
	seen chan struct{} // signalled after every call
}

func newRecorder() *recorder { return &recorder{seen: make(chan struct{}, 1)} }

func (r *recorder) Publish(_ context.Context, msgs []outbox.Message) []error {
	defer func() {
		select {
		case r.seen <- struct{}{}:
		default:
		}
	}()
	if r.down.Load() {
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = errors.New("broker down")
		}
		return errs
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, msgs...)
	return nil
}

func (r *recorder) published() []outbox.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]outbox.Message(nil), r.log...)
}

// openOutbox opens the SQLite file at path as another process would: its
// own store and outbox.
func openOutbox(t *testing.T, path string) (*sqlitestore.Store, *sqliteoutbox.Store) {
	t.Helper()
	st, err := sqlitestore.Open(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ob, err := sqliteoutbox.New(st.DB(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return st, ob
}

// fill adds n messages over keys keys (key "" for every tenth) in
// transactions of ten.
func fill(t *testing.T, st *sqlitestore.Store, ob *sqliteoutbox.Store, from, n, keys int) {
	t.Helper()
	exec, err := idem.NewExecutor(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := from; i < from+n; i += 10 {
		if _, err := exec.Do(context.Background(), idem.DoParams{Scope: "fill", Key: fmt.Sprint(i), Fingerprint: "f"}, func(ctx context.Context) (*idem.Response, error) {
			for j := i; j < i+10 && j < from+n; j++ {
				key := fmt.Sprint("key-", j%keys)
				if j%10 == 9 {
					key = ""
				}
				if err := ob.Add(ctx, outbox.Message{ID: fmt.Sprint("m-", j), Topic: "t", Key: key, Payload: []byte(fmt.Sprint(j))}); err != nil {
					return nil, err
				}
			}
			return &idem.Response{StatusCode: 200}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// runDispatcher runs d until the test ends.
func runDispatcher(t *testing.T, d *outbox.Dispatcher) context.CancelFunc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = d.Run(ctx)
	}()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// waitPublished waits until every id in 0..n-1 was published.
func waitPublished(t *testing.T, r *recorder, n int) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		ids := map[string]bool{}
		for _, m := range r.published() {
			ids[m.ID] = true
		}
		if len(ids) >= n {
			return
		}
		select {
		case <-r.seen:
		case <-time.After(200 * time.Millisecond): // idle dispatchers poll
		case <-deadline:
			t.Fatalf("%d of %d messages published", len(ids), n)
		}
	}
}

// checkOrder checks that each key's messages were first published in
// sequence order.
func checkOrder(t *testing.T, log []outbox.Message) {
	t.Helper()
	last := map[string]int64{}
	first := map[string]bool{}
	for _, m := range log {
		if m.Key == "" || first[m.ID] {
			continue
		}
		first[m.ID] = true
		if m.Seq < last[m.Key] {
			t.Errorf("key %s: %s (seq %d) published after seq %d", m.Key, m.ID, m.Seq, last[m.Key])
		}
		last[m.Key] = m.Seq
	}
}

// Three dispatchers in "three processes" share one outbox: each message
// is published exactly once, a key's messages in order.
func TestDispatchersShareAnOutbox(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "o.db")
	st, ob := openOutbox(t, path)
	rec := newRecorder()
	for range 3 {
		_, obi := openOutbox(t, path)
		d, err := outbox.NewDispatcher(obi, rec, &outbox.Config{BatchSize: 25, PollInterval: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		runDispatcher(t, d)
	}
	const n = 600
	fill(t, st, ob, 0, n, 7)
	waitPublished(t, rec, n)
	log := rec.published()
	if len(log) != n {
		t.Errorf("%d publishes of %d messages, want each once", len(log), n)
	}
	checkOrder(t, log)
	// Marking follows publishing: wait for it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := ob.Pending(context.Background())
		if err == nil && p == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d still pending (%v)", p, err)
		}
		time.Sleep(10 * time.Millisecond) // polling the database
	}
	if len(rec.published()) != n {
		t.Errorf("%d publishes after marking, want %d", len(rec.published()), n)
	}
}

// While the broker is down, messages stay in the outbox; when it returns
// they are all published, a key's messages still in order.
func TestDispatcherRetriesWhileBrokerDown(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "o.db")
	st, ob := openOutbox(t, path)
	rec := newRecorder()
	rec.down.Store(true)
	d, err := outbox.NewDispatcher(ob, rec, &outbox.Config{PollInterval: 5 * time.Millisecond, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runDispatcher(t, d)
	fill(t, st, ob, 0, 100, 3)
	// Wait for failed attempts, then bring the broker back.
	for d.Stats().Failed < 200 {
		<-rec.seen
	}
	if p, _ := ob.Pending(context.Background()); p != 100 {
		t.Fatalf("%d pending while the broker is down, want 100", p)
	}
	rec.down.Store(false)
	waitPublished(t, rec, 100)
	checkOrder(t, rec.published())
	if s := d.Stats(); s.Published != 100 {
		t.Errorf("stats %+v, want 100 published", s)
	}
}

// A dispatcher that stops after claiming leaves its messages to another
// once its lease ends; cleanup deletes sent messages after the retention.
func TestDispatcherTakesOverAndCleansUp(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "o.db")
	st, ob := openOutbox(t, path)
	fill(t, st, ob, 0, 30, 3)
	// A "dead" dispatcher: claimed everything and never came back.
	if got, err := ob.Claim(context.Background(), outbox.ClaimParams{Owner: "dead", Limit: 100, Lease: 300 * time.Millisecond, Now: time.Now()}); err != nil || len(got) != 30 {
		t.Fatalf("claimed %d, %v", len(got), err)
	}
	rec := newRecorder()
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	d, err := outbox.NewDispatcher(ob, rec, &outbox.Config{PollInterval: 5 * time.Millisecond, Retention: time.Hour, CleanupInterval: -1,
		NowFunc: func() time.Time { return time.Unix(0, clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := d.RunOnce(context.Background()); err != nil || n != 0 {
		t.Fatalf("RunOnce under the dead claim: %d, %v", n, err)
	}
	clock.Add(int64(time.Second)) // past the dead dispatcher's lease
	if n, err := d.RunOnce(context.Background()); err != nil || n != 30 {
		t.Fatalf("RunOnce after the lease: %d, %v", n, err)
	}
	if len(rec.published()) != 30 {
		t.Fatalf("%d published", len(rec.published()))
	}
	if n, err := d.Cleanup(context.Background()); err != nil || n != 0 {
		t.Fatalf("Cleanup within the retention: %d, %v", n, err)
	}
	clock.Add(int64(2 * time.Hour))
	if n, err := d.Cleanup(context.Background()); err != nil || n != 30 {
		t.Fatalf("Cleanup after the retention: %d, %v", n, err)
	}
}

// Notify wakes a polling dispatcher at once, but does not cut short its
// back-off while the broker fails.
func TestDispatcherNotify(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "o.db")
	st, ob := openOutbox(t, path)
	rec := newRecorder()
	d, err := outbox.NewDispatcher(ob, rec, &outbox.Config{PollInterval: time.Hour, MinBackoff: time.Hour, MaxBackoff: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	runDispatcher(t, d) // its first cycle finds nothing; it then polls hourly
	fill(t, st, ob, 0, 10, 3)
	d.Notify()
	waitPublished(t, rec, 10)

	rec.down.Store(true)
	fill(t, st, ob, 10, 10, 3)
	d.Notify()
	// The failed attempt; the dispatcher then backs off for an hour.
	deadline := time.Now().Add(30 * time.Second)
	for d.Stats().Failed == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no failed attempt")
		}
		time.Sleep(time.Millisecond) // polling the counter
	}
	select {
	case <-rec.seen: // drain the signal of that attempt
	default:
	}
	rec.down.Store(false)
	for range 5 {
		d.Notify()
	}
	select {
	case <-rec.seen:
		t.Fatal("Notify cut the back-off short")
	case <-time.After(300 * time.Millisecond): // nothing may happen; bounded wait
	}
}

// RetryNow cuts a back-off short: with the broker back, a message whose
// publish failed goes out at once instead of after an hour's back-off.
func TestDispatcherRetryNow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.add(t, "k", false, msg("m1", "")); err != nil {
		t.Fatal(err)
	}
	pub := newRecorder()
	pub.down.Store(true)
	d, err := outbox.NewDispatcher(b.ob, pub, &outbox.Config{MinBackoff: time.Hour, MaxBackoff: time.Hour, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-pub.seen // the failed attempt; Run now backs off for an hour
	pub.down.Store(false)
	d.Notify() // a notification does not end a back-off
	d.RetryNow()
	deadline := time.After(10 * time.Second)
	for len(pub.published()) == 0 {
		select {
		case <-pub.seen:
		case <-deadline:
			t.Fatal("RetryNow did not end the back-off: nothing published")
		}
	}
}
