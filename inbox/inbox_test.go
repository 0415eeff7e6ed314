package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/memstore"
)

func newInbox(t *testing.T, name string, store idemstore.Store) *inbox.Inbox {
	t.Helper()
	exec, err := idem.NewExecutor(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	in, err := inbox.New(exec, inbox.Config{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func newMem(t *testing.T) idemstore.Store {
	t.Helper()
	s, err := memstore.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestProcessRunsOncePerID(t *testing.T) {
	t.Parallel()
	in := newInbox(t, "ledger", newMem(t))
	ctx := context.Background()
	var runs atomic.Int32
	h := func(context.Context, inbox.Message) error { runs.Add(1); return nil }
	m := inbox.Message{ID: "m1", Topic: "payments", Payload: []byte(`{"a":1}`)}
	for i, want := range []bool{false, true, true} {
		a, replayed, err := in.Process(ctx, m, h)
		if a != inbox.Ack || err != nil || replayed != want {
			t.Fatalf("delivery %d: %v, replayed %v, %v; want ack, replayed %v", i, a, replayed, err, want)
		}
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
	// Another id, another topic, another consumer: each runs.
	for _, c := range []struct {
		in *inbox.Inbox
		m  inbox.Message
	}{
		{in, inbox.Message{ID: "m2", Topic: "payments", Payload: m.Payload}},
		{in, inbox.Message{ID: "m1", Topic: "refunds", Payload: m.Payload}},
	} {
		if a, replayed, err := c.in.Process(ctx, c.m, h); a != inbox.Ack || replayed || err != nil {
			t.Fatalf("%+v: %v %v %v", c.m, a, replayed, err)
		}
	}
	if runs.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3", runs.Load())
	}
}

func TestProcessFailuresAndBadMessages(t *testing.T) {
	t.Parallel()
	in := newInbox(t, "ledger", newMem(t))
	ctx := context.Background()
	boom := errors.New("boom")
	m := inbox.Message{ID: "m1", Topic: "payments", Payload: []byte("x")}
	a, _, err := in.Process(ctx, m, func(context.Context, inbox.Message) error { return boom })
	if a != inbox.Retry || !errors.Is(err, boom) {
		t.Fatalf("failing handler: %v, %v; want retry with its error", a, err)
	}
	// The failure left the id free: the redelivery runs.
	ran := false
	if a, _, err := in.Process(ctx, m, func(context.Context, inbox.Message) error { ran = true; return nil }); a != inbox.Ack || err != nil || !ran {
		t.Fatalf("redelivery after a failure: %v, %v, ran %v", a, err, ran)
	}
	// The same id with another payload is never handled.
	m.Payload = []byte("y")
	if a, _, err := in.Process(ctx, m, func(context.Context, inbox.Message) error { t.Error("ran"); return nil }); a != inbox.Drop || !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("reused id: %v, %v; want drop", a, err)
	}
	// A poison message is dropped, not retried.
	if a, _, err := in.Process(ctx, inbox.Message{ID: "poison", Topic: "payments"}, func(context.Context, inbox.Message) error {
		return fmt.Errorf("bad payload: %w", inbox.ErrUnprocessable)
	}); a != inbox.Drop || !errors.Is(err, inbox.ErrUnprocessable) {
		t.Fatalf("unprocessable: %v, %v; want drop", a, err)
	}
	for _, id := range []string{"", strings.Repeat("x", idem.MaxKeyLength+1), "tab\there"} {
		if a, _, err := in.Process(ctx, inbox.Message{ID: id, Topic: "payments"}, func(context.Context, inbox.Message) error { t.Error("ran"); return nil }); a != inbox.Drop || err == nil {
			t.Fatalf("id %q: %v, %v; want drop", id, a, err)
		}
	}
	if _, err := inbox.New(nil, inbox.Config{Name: "x"}); err == nil {
		t.Fatal("New accepted a nil executor")
	}
}

// Deliveries of one id to many consumers at once: the handler runs once;
// the others are told to retry (the first is still running) or to ack.
func TestProcessConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	in := newInbox(t, "ledger", newMem(t))
	var runs atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{})
	h := func(context.Context, inbox.Message) error {
		if runs.Add(1) == 1 {
			close(started)
		}
		<-release
		return nil
	}
	m := inbox.Message{ID: "m1", Topic: "payments", Payload: []byte("x")}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if a, _, err := in.Process(context.Background(), m, h); a != inbox.Ack || err != nil {
			t.Errorf("first delivery: %v, %v", a, err)
		}
	}()
	<-started
	const others = 8
	var retries atomic.Int32
	var owg sync.WaitGroup
	for range others {
		owg.Add(1)
		go func() {
			defer owg.Done()
			a, _, err := in.Process(context.Background(), m, h)
			if a == inbox.Retry && errors.Is(err, idemstore.ErrInFlight) {
				retries.Add(1)
				return
			}
			t.Errorf("concurrent delivery: %v, %v; want retry (in flight)", a, err)
		}()
	}
	owg.Wait() // each concurrent delivery answers at once (no wait mode)
	if retries.Load() != others {
		t.Errorf("%d of %d concurrent deliveries told to retry", retries.Load(), others)
	}
	close(release)
	wg.Wait()
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
}
