package sqlitestore_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/sqlitestore"
)

func insertPayment(ctx context.Context, note string) error {
	tx, err := sqlitestore.Tx(ctx)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO payments (note) VALUES (?)`, note)
	return err
}

// A step's writes commit with its recovery point; a failed later step
// leaves them committed, and the retry resumes without repeating them.
func TestStepWritesCommitWithTheRecoveryPoint(t *testing.T) {
	t.Parallel()
	s, _ := open(t)
	business(t, s)
	exec, err := idem.NewExecutor(s, nil)
	if err != nil {
		t.Fatal(err)
	}
	var firstRuns atomic.Int32
	fail := true
	op := func(ctx context.Context) (*idemstore.Response, error) {
		if _, err := idem.Step(ctx, "first", func(ctx context.Context) ([]byte, error) {
			firstRuns.Add(1)
			return nil, insertPayment(ctx, "first")
		}); err != nil {
			return nil, err
		}
		if _, err := idem.Step(ctx, "second", func(ctx context.Context) ([]byte, error) {
			if err := insertPayment(ctx, "second"); err != nil {
				return nil, err
			}
			if fail {
				return nil, errors.New("provider down") // its write rolls back
			}
			return nil, nil
		}); err != nil {
			return nil, err
		}
		return &idemstore.Response{StatusCode: 201}, insertPayment(ctx, "final")
	}
	p := idem.DoParams{Scope: "s", Key: "k", Fingerprint: "v1:x"}
	res, err := exec.Do(t.Context(), p, op)
	if err == nil || !res.Suspended {
		t.Fatalf("first attempt: %v, suspended %v", err, res.Suspended)
	}
	if n := countPayments(t, s); n != 1 {
		t.Fatalf("%d rows after the first attempt, want 1 (the first step's)", n)
	}
	fail = false
	// A take-over answers "in progress" when it cannot get the write lock
	// within 100 ms (a loaded machine): retry as a client would.
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err = exec.Do(t.Context(), p, op)
		if !errors.Is(err, idemstore.ErrInFlight) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // a client's back-off, not synchronisation
	}
	if err != nil || res.Response.StatusCode != 201 {
		t.Fatalf("retry: %v", err)
	}
	if n, runs := countPayments(t, s), firstRuns.Load(); n != 3 || runs != 1 {
		t.Errorf("%d rows, first step ran %d times; want 3 and 1", n, runs)
	}
}

// A stale owner's step writes never commit: its recovery point is fenced,
// and its transaction rolls back.
func TestStaleOwnerStepRollsBack(t *testing.T) {
	t.Parallel()
	s, _ := open(t)
	business(t, s)
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	cfg := &idem.Config{Lease: time.Hour, TTL: 24 * time.Hour, NowFunc: clock}
	stale, _ := idem.NewExecutor(s, cfg)
	successor, _ := idem.NewExecutor(s, cfg)
	p := idem.DoParams{Scope: "s", Key: "k", Fingerprint: "v1:x"}
	inside, proceed := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := stale.Do(context.Background(), p, func(ctx context.Context) (*idemstore.Response, error) {
			_, err := idem.Step(ctx, "write", func(ctx context.Context) ([]byte, error) {
				close(inside)
				<-proceed
				return nil, insertPayment(ctx, "stale")
			})
			return &idemstore.Response{StatusCode: 200}, err
		})
		errc <- err
	}()
	<-inside
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	res, err := successor.Do(t.Context(), p, func(ctx context.Context) (*idemstore.Response, error) {
		_, err := idem.Step(ctx, "write", func(ctx context.Context) ([]byte, error) { return nil, insertPayment(ctx, "successor") })
		return &idemstore.Response{StatusCode: 200}, err
	})
	if err != nil || !res.TookOver {
		t.Fatalf("successor: %v, took over %v", err, res.TookOver)
	}
	close(proceed)
	if err := <-errc; !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("stale owner: %v, want ErrLeaseLost", err)
	}
	var notes []string
	rows, err := s.ReadDB().Query(`SELECT note FROM payments`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var n string
		_ = rows.Scan(&n)
		notes = append(notes, n)
	}
	if len(notes) != 1 || notes[0] != "successor" {
		t.Errorf("rows = %q, want only the successor's", notes)
	}
}

// Version 3 replaces the stuck index with the in-flight index, and Stuck's
// query is served by it rather than by reading the table.
func TestInflightIndex(t *testing.T) {
	t.Parallel()
	s, _ := open(t)
	ctx := t.Context()
	var inflight, stuck int
	if err := s.ReadDB().QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = ?),
		(SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = ?)`,
		s.Table()+"_inflight", s.Table()+"_stuck").Scan(&inflight, &stuck); err != nil {
		t.Fatal(err)
	}
	if inflight != 1 || stuck != 0 {
		t.Fatalf("indexes after migration: inflight %d, stuck %d; want 1 and 0", inflight, stuck)
	}
	rows, err := s.ReadDB().QueryContext(ctx, `EXPLAIN QUERY PLAN SELECT scope, key FROM `+s.Table()+`
		WHERE state = 1 AND checkpoint IS NOT NULL AND lease_until <= ? AND expires_at > ? ORDER BY lease_until LIMIT 10`, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan += detail + "\n"
	}
	if !strings.Contains(plan, s.Table()+"_inflight") {
		t.Errorf("Stuck's query does not use the in-flight index:\n%s", plan)
	}
}
