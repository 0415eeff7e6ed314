package sqliteoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/outbox/outboxtest"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/idemhq/idem/sqlitestore/sqliteoutbox"
)

type testBundle struct {
	store *sqlitestore.Store
	ob    *sqliteoutbox.Store
	exec  *idem.Executor
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "outbox.db"), nil)
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
	if err := ob.Migrate(ctx); err != nil { // idempotent
		t.Fatal(err)
	}
	exec, err := idem.NewExecutor(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{store: st, ob: ob, exec: exec}
}

// add adds msgs in an execution under key, the way a handler does.
func (b *testBundle) add(t *testing.T, key string, fail bool, msgs ...outbox.Message) error {
	t.Helper()
	_, err := b.exec.Do(context.Background(), idem.DoParams{Scope: "s", Key: key, Fingerprint: "fp"}, func(ctx context.Context) (*idemstore.Response, error) {
		if err := b.ob.Add(ctx, msgs...); err != nil {
			return nil, err
		}
		if fail {
			return nil, errors.New("the operation failed after adding")
		}
		return &idemstore.Response{StatusCode: 200}, nil
	})
	return err
}

func (b *testBundle) pending(t *testing.T) int64 {
	t.Helper()
	n, err := b.ob.Pending(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func msg(id, key string) outbox.Message {
	return outbox.Message{ID: id, Topic: "t.created", Key: key, Payload: []byte(`{"id":"` + id + `"}`), Headers: map[string]string{"Event-Type": "created"}}
}

func TestAddCommitsWithTheOperation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if err := b.add(t, "k1", false, msg("m1", ""), msg("m2", "")); err != nil {
		t.Fatal(err)
	}
	if err := b.add(t, "k2", true, msg("m3", "")); err == nil {
		t.Fatal("the failing operation returned no error")
	}
	if n := b.pending(t); n != 2 {
		t.Fatalf("%d messages pending, want 2 (the failed operation's message rolled back)", n)
	}
	// A re-executed operation adding the same id does not add it twice.
	if err := b.add(t, "k3", false, msg("m1", "")); err != nil {
		t.Fatal(err)
	}
	if n := b.pending(t); n != 2 {
		t.Fatalf("%d messages pending after adding m1 again, want 2", n)
	}
	// Outside an execution there is no transaction to join.
	if err := b.ob.Add(context.Background(), msg("m4", "")); !errors.Is(err, idem.ErrNoTx) {
		t.Fatalf("Add outside an execution: %v, want ErrNoTx", err)
	}
	got, err := b.ob.Claim(context.Background(), outbox.ClaimParams{Owner: "a", Limit: 10, Lease: time.Minute, Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != "m1" || got[1].ID != "m2" || string(got[0].Payload) != `{"id":"m1"}` || got[0].Headers["Event-Type"] != "created" || got[0].Topic != "t.created" {
		t.Fatalf("claimed %+v", got)
	}
}

func TestAddValidates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, m := range []outbox.Message{
		{ID: "x", Topic: ""},
		{ID: "x", Topic: "a b"},
		{ID: "x", Topic: "a.>"},
		{ID: "bad id", Topic: "t"},
		{ID: "x", Topic: "t", Payload: make([]byte, outbox.DefaultMaxPayload+1)},
		{ID: "x", Topic: "t", Headers: map[string]string{"a:b": "v"}},
		{ID: "x", Topic: "t", Headers: map[string]string{"a": "v\r\nb: c"}},
	} {
		if err := b.add(t, "k-"+outbox.NewID(), false, m); !errors.Is(err, outbox.ErrInvalidMessage) {
			t.Errorf("Add(%.60v): %v, want ErrInvalidMessage", m, err)
		}
	}
	// A missing id is generated.
	if err := b.add(t, "k-gen", false, outbox.Message{Topic: "t"}); err != nil {
		t.Fatal(err)
	}
	got, err := b.ob.Claim(context.Background(), outbox.ClaimParams{Owner: "a", Limit: 10, Lease: time.Minute, Now: time.Now()})
	if err != nil || len(got) != 1 || len(got[0].ID) < 10 {
		t.Fatalf("claimed %+v, %v", got, err)
	}
}

func TestClaimLeasesAndKeyOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if err := b.add(t, "k", false, msg("k1-a", "k1"), msg("k1-b", "k1"), msg("k2-a", "k2"), msg("free", "")); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	claim := func(owner string, limit int, at time.Time) []string {
		t.Helper()
		got, err := b.ob.Claim(ctx, outbox.ClaimParams{Owner: owner, Limit: limit, Lease: 10 * time.Second, Now: at})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range got {
			ids = append(ids, m.ID)
		}
		return ids
	}
	if got := claim("a", 1, now); !slices.Equal(got, []string{"k1-a"}) {
		t.Fatalf("a claimed %v", got)
	}
	// k1-b waits for k1-a, held by a.
	if got := claim("b", 10, now.Add(5*time.Second)); !slices.Equal(got, []string{"k2-a", "free"}) {
		t.Fatalf("b claimed %v, want k2-a and free (k1-b waits behind a's k1-a)", got)
	}
	if got := claim("c", 10, now.Add(5*time.Second)); len(got) != 0 {
		t.Fatalf("c claimed %v while everything is held", got)
	}
	// a's lease runs out: its message and the one behind it are free.
	if got := claim("c", 10, now.Add(11*time.Second)); !slices.Equal(got, []string{"k1-a", "k1-b"}) {
		t.Fatalf("c claimed %v after a's lease, want k1-a, k1-b", got)
	}
	all, err := b.ob.Claim(ctx, outbox.ClaimParams{Owner: "d", Limit: 10, Lease: time.Second, Now: now.Add(time.Minute)})
	if err != nil || len(all) != 4 {
		t.Fatalf("claimed %d after every lease, %v", len(all), err)
	}
	var seqs []int64
	for _, m := range all {
		seqs = append(seqs, m.Seq)
	}
	// A release by another owner does nothing; d's own frees them.
	if err := b.ob.Release(ctx, "x", seqs); err != nil {
		t.Fatal(err)
	}
	if got := claim("e", 10, now.Add(time.Minute)); len(got) != 0 {
		t.Fatalf("claimed %v after another owner's release", got)
	}
	if err := b.ob.Release(ctx, "d", seqs[:2]); err != nil {
		t.Fatal(err)
	}
	if got := claim("e", 10, now.Add(time.Minute)); !slices.Equal(got, []string{"k1-a", "k1-b"}) {
		t.Fatalf("claimed %v after d's release", got)
	}
	if err := b.ob.MarkSent(ctx, "e", seqs); err != nil {
		t.Fatal(err)
	}
	if n := b.pending(t); n != 0 {
		t.Fatalf("%d pending after MarkSent", n)
	}
	if got := claim("f", 10, now.Add(time.Hour)); len(got) != 0 {
		t.Fatalf("claimed sent messages %v", got)
	}
}

func TestDeleteSentInBatches(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	clock := now
	var mu sync.Mutex
	st, err := sqlitestore.Open(context.Background(), filepath.Join(t.TempDir(), "o.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ob, err := sqliteoutbox.New(st.DB(), &sqliteoutbox.Config{Table: "my_outbox", NowFunc: func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	exec, _ := idem.NewExecutor(st, nil)
	for i := range 25 {
		if _, err := exec.Do(ctx, idem.DoParams{Scope: "s", Key: fmt.Sprint(i), Fingerprint: "f"}, func(ctx context.Context) (*idemstore.Response, error) {
			return &idemstore.Response{StatusCode: 200}, ob.Add(ctx, msg(fmt.Sprint("m", i), ""))
		}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := ob.Claim(ctx, outbox.ClaimParams{Owner: "a", Limit: 20, Lease: time.Minute, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, m := range got {
		seqs = append(seqs, m.Seq)
	}
	if err := ob.MarkSent(ctx, "a", seqs); err != nil {
		t.Fatal(err)
	}
	// Nothing is old enough yet.
	if n, err := ob.DeleteSent(ctx, now.Add(-time.Second), 8); err != nil || n != 0 {
		t.Fatalf("DeleteSent before retention: %d, %v", n, err)
	}
	var total int
	for {
		n, err := ob.DeleteSent(ctx, now, 8)
		if err != nil {
			t.Fatal(err)
		}
		if n > 8 {
			t.Fatalf("deleted %d in one batch of 8", n)
		}
		total += n
		if n < 8 {
			break
		}
	}
	if total != 20 {
		t.Fatalf("deleted %d sent messages, want 20", total)
	}
	if n, _ := ob.Pending(ctx); n != 5 {
		t.Fatalf("%d pending, want the 5 unsent kept", n)
	}
	if _, err := sqliteoutbox.New(st.DB(), &sqliteoutbox.Config{Table: "bad-name"}); err == nil {
		t.Fatal("New accepted a table name that is not an identifier")
	}
}

func TestInspector(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if ok, err := b.ob.Exists(ctx); err != nil || !ok {
		t.Fatalf("Exists after Migrate = %v, %v", ok, err)
	}
	other, err := sqliteoutbox.New(b.store.DB(), &sqliteoutbox.Config{Table: "no_such_outbox"})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := other.Exists(ctx); err != nil || ok {
		t.Fatalf("Exists of a table never migrated = %v, %v", ok, err)
	}
	n := 0
	outboxtest.RunInspector(t, b.ob, func(ctx context.Context, msgs ...outbox.Message) error {
		n++
		return b.add(t, fmt.Sprint("inspect-", n), false, msgs...)
	})
}
