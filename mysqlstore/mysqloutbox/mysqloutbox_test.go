package mysqloutbox_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/mysqlstore"
	"github.com/idemhq/idem/mysqlstore/mysqloutbox"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/outbox/outboxtest"
)

const defaultMySQLURL = "root@tcp(127.0.0.1:3306)/test"

type testBundle struct {
	db   *sql.DB
	ob   *mysqloutbox.Store
	exec *idem.Executor
}

// setup returns an outbox and a records store in fresh tables, dropped
// when the test ends. It skips when MariaDB is unreachable, unless CI is
// set.
func setup(t testing.TB) *testBundle {
	t.Helper()
	url := os.Getenv("IDEM_TEST_MYSQL_URL")
	if url == "" {
		url = defaultMySQLURL
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg, err := mysql.ParseDSN(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.InterpolateParams = true
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		if os.Getenv("CI") != "" {
			t.Fatalf("MariaDB unreachable (CI is set): %v", err)
		}
		t.Skipf("MariaDB unreachable: %v", err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	suffix := hex.EncodeToString(b)
	records, events := "records_"+suffix, "outbox_"+suffix
	t.Cleanup(func() {
		for _, q := range []string{"DROP TABLE IF EXISTS `" + records + "`", "DROP TABLE IF EXISTS `" + events + "`"} {
			if _, err := db.ExecContext(context.Background(), q); err != nil {
				t.Errorf("%s: %v", q, err)
			}
		}
		if _, err := db.ExecContext(context.Background(), "DELETE FROM idem_migrations WHERE table_name = ?", records); err != nil {
			t.Error(err)
		}
		db.Close()
	})
	st, err := mysqlstore.New(ctx, db, &mysqlstore.Config{Table: records})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := mysqloutbox.New(db, &mysqloutbox.Config{Table: events})
	if err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	exec, err := idem.NewExecutor(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &testBundle{db: db, ob: ob, exec: exec}
}

func (b *testBundle) add(t testing.TB, key string, fail bool, msgs ...outbox.Message) error {
	t.Helper()
	_, err := b.exec.Do(context.Background(), idem.DoParams{Scope: "s", Key: key, Fingerprint: "fp"}, func(ctx context.Context) (*idemstore.Response, error) {
		if err := b.ob.Add(ctx, msgs...); err != nil {
			return nil, err
		}
		if fail {
			return nil, errors.New("failed after adding")
		}
		return &idemstore.Response{StatusCode: 200}, nil
	})
	return err
}

func msg(id, key string) outbox.Message {
	return outbox.Message{ID: id, Topic: "t.created", Key: key, Payload: []byte(id), Headers: map[string]string{"Event-Type": "created"}}
}

func ids(ms []outbox.Message) []string {
	var r []string
	for _, m := range ms {
		r = append(r, m.ID)
	}
	return r
}

func TestAddClaimMarkRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if err := b.add(t, "k1", false, msg("k1-a", "k1"), msg("k1-b", "k1"), msg("k2-a", "k2"), msg("free", "")); err != nil {
		t.Fatal(err)
	}
	if err := b.add(t, "k2", true, msg("rolled-back", "")); err == nil {
		t.Fatal("the failing operation returned no error")
	}
	if err := b.add(t, "k3", false, msg("k1-a", "k1")); err != nil { // same id again
		t.Fatal(err)
	}
	if n, _ := b.ob.Pending(ctx); n != 4 {
		t.Fatalf("%d pending, want 4", n)
	}
	if err := b.ob.Add(ctx, msg("x", "")); !errors.Is(err, idem.ErrNoTx) {
		t.Fatalf("Add outside an execution: %v", err)
	}
	claim := func(owner string, limit int, lease time.Duration) []outbox.Message {
		t.Helper()
		got, err := b.ob.Claim(ctx, outbox.ClaimParams{Owner: owner, Limit: limit, Lease: lease})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	a := claim("a", 1, 300*time.Millisecond)
	if !slices.Equal(ids(a), []string{"k1-a"}) || a[0].Headers["Event-Type"] != "created" || string(a[0].Payload) != "k1-a" {
		t.Fatalf("a claimed %+v", a)
	}
	if got := ids(claim("b", 10, time.Minute)); !slices.Equal(got, []string{"k2-a", "free"}) {
		t.Fatalf("b claimed %v, want k2-a, free (k1-b waits behind k1-a)", got)
	}
	// a's short lease runs out (server clock): k1-a and k1-b are free.
	deadline := time.Now().Add(10 * time.Second)
	var c []outbox.Message
	for len(c) == 0 && time.Now().Before(deadline) {
		c = claim("c", 10, time.Minute)
		if len(c) == 0 {
			time.Sleep(50 * time.Millisecond) // the lease is measured by the server's clock
		}
	}
	if got := ids(c); !slices.Equal(got, []string{"k1-a", "k1-b"}) {
		t.Fatalf("c claimed %v after a's lease, want k1-a, k1-b", got)
	}
	seqs := []int64{c[0].Seq, c[1].Seq}
	if err := b.ob.Release(ctx, "other", seqs); err != nil {
		t.Fatal(err)
	}
	if got := claim("d", 10, time.Minute); len(got) != 0 {
		t.Fatalf("claimed %v after another owner's release", ids(got))
	}
	if err := b.ob.Release(ctx, "c", seqs); err != nil {
		t.Fatal(err)
	}
	d := claim("d", 10, time.Minute)
	if len(d) != 2 {
		t.Fatalf("claimed %v after c's release", ids(d))
	}
	if err := b.ob.MarkSent(ctx, "d", []int64{d[0].Seq, d[1].Seq}); err != nil {
		t.Fatal(err)
	}
	if n, _ := b.ob.Pending(ctx); n != 2 {
		t.Fatalf("%d pending, want 2 (b's)", n)
	}
	if n, err := b.ob.DeleteSent(ctx, time.Now().Add(time.Hour), 1); err != nil || n != 1 {
		t.Fatalf("DeleteSent: %d, %v", n, err)
	}
	if n, err := b.ob.DeleteSent(ctx, time.Now().Add(-time.Hour), 10); err != nil || n != 0 {
		t.Fatalf("DeleteSent before retention: %d, %v", n, err)
	}
}

type recorder struct {
	mu  sync.Mutex
	log []outbox.Message
}

func (r *recorder) Publish(_ context.Context, msgs []outbox.Message) []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, msgs...)
	return nil
}

// Three dispatchers on one outbox publish each message once, a key's
// messages in order.
func TestDispatchersShareAnOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rec := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var dispatchers []*outbox.Dispatcher
	for range 3 {
		d, err := outbox.NewDispatcher(b.ob, rec, &outbox.Config{BatchSize: 20, PollInterval: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		dispatchers = append(dispatchers, d)
		wg.Add(1)
		go func() { defer wg.Done(); _ = d.Run(ctx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	const n = 400
	for i := 0; i < n; i += 10 {
		var ms []outbox.Message
		for j := i; j < i+10; j++ {
			ms = append(ms, msg(fmt.Sprint("m-", j), fmt.Sprint("key-", j%7)))
		}
		if err := b.add(t, fmt.Sprint("fill-", i), false, ms...); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		p, err := b.ob.Pending(context.Background())
		if err == nil && p == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d pending (%v)", p, err)
		}
		time.Sleep(20 * time.Millisecond) // polling the database
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.log) != n {
		t.Errorf("%d publishes of %d messages, want each once", len(rec.log), n)
	}
	last := map[string]int64{}
	for _, m := range rec.log {
		if m.Seq < last[m.Key] {
			t.Errorf("key %s: seq %d after %d", m.Key, m.Seq, last[m.Key])
		}
		last[m.Key] = m.Seq
	}
	var total int64
	for _, d := range dispatchers {
		total += d.Stats().Published
	}
	if total != n {
		t.Errorf("dispatchers count %d published, want %d", total, n)
	}
}

func TestInspector(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	if ok, err := b.ob.Exists(ctx); err != nil || !ok {
		t.Fatalf("Exists after Migrate = %v, %v", ok, err)
	}
	other, err := mysqloutbox.New(b.db, &mysqloutbox.Config{Table: "no_such_outbox"})
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
