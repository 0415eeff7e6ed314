package pgstore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/jackc/pgx/v5"
)

// stepsFixture is a store with a business table of notes.
func stepsFixture(t *testing.T, mode string) (*fixture, string) {
	t.Helper()
	f := newFixtureIn(t, mode, nil)
	notes := pgx.Identifier{f.schema, "notes"}.Sanitize()
	f.exec(t, "CREATE TABLE "+notes+" (id bigserial PRIMARY KEY, note text NOT NULL)")
	return f, notes
}

func insertNote(ctx context.Context, table, note string) error {
	return execTx(ctx, "INSERT INTO "+table+" (note) VALUES ($1)", note)
}

func (f *fixture) notes(t *testing.T, table string) []string {
	t.Helper()
	rows, err := f.pool.Query(context.Background(), "SELECT note FROM "+table+" ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A step's writes commit with its recovery point; the retry resumes
// after it.
func TestStepWritesCommitWithTheRecoveryPoint(t *testing.T) {
	t.Parallel()
	eachMode(t, testStepWritesCommitWithTheRecoveryPoint)
}

func testStepWritesCommitWithTheRecoveryPoint(t *testing.T, mode string) {
	f, table := stepsFixture(t, mode)
	exec, err := idem.NewExecutor(f.store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var firstRuns atomic.Int32
	var fail atomic.Bool
	fail.Store(true)
	op := func(ctx context.Context) (*idemstore.Response, error) {
		if _, err := idem.Step(ctx, "first", func(ctx context.Context) ([]byte, error) {
			firstRuns.Add(1)
			return nil, insertNote(ctx, table, "first")
		}); err != nil {
			return nil, err
		}
		if _, err := idem.Step(ctx, "second", func(ctx context.Context) ([]byte, error) {
			if err := insertNote(ctx, table, "second"); err != nil {
				return nil, err
			}
			if fail.Load() {
				return nil, errors.New("provider down")
			}
			return nil, nil
		}); err != nil {
			return nil, err
		}
		return &idemstore.Response{StatusCode: 201}, insertNote(ctx, table, "final")
	}
	p := idem.DoParams{Scope: "s", Key: "k", Fingerprint: "v1:x"}
	res, err := exec.Do(t.Context(), p, op)
	if err == nil || !res.Suspended {
		t.Fatalf("first attempt: %v, suspended %v", err, res.Suspended)
	}
	if got := f.notes(t, table); len(got) != 1 || got[0] != "first" {
		t.Fatalf("rows after the first attempt = %q, want [first]", got)
	}
	fail.Store(false)
	if res, err = exec.Do(t.Context(), p, op); err != nil || !res.TookOver || res.Response.StatusCode != 201 {
		t.Fatalf("retry: %v", err)
	}
	if got := f.notes(t, table); len(got) != 3 || firstRuns.Load() != 1 {
		t.Errorf("rows %q, first step ran %d times; want 3 rows and 1 run", got, firstRuns.Load())
	}
}

// A stale owner (its lease ended in the database and the record was taken
// over) commits none of its step's writes.
func TestStaleOwnerStepRollsBack(t *testing.T) {
	t.Parallel()
	eachMode(t, testStaleOwnerStepRollsBack)
}

func testStaleOwnerStepRollsBack(t *testing.T, mode string) {
	f, table := stepsFixture(t, mode)
	cfg := &idem.Config{Lease: time.Hour, TTL: 24 * time.Hour}
	stale, _ := idem.NewExecutor(f.store, cfg)
	successor, _ := idem.NewExecutor(f.store, cfg)
	p := idem.DoParams{Scope: "s", Key: "k", Fingerprint: "v1:x"}
	inside, proceed := make(chan struct{}), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		_, err := stale.Do(context.Background(), p, func(ctx context.Context) (*idemstore.Response, error) {
			_, err := idem.Step(ctx, "write", func(ctx context.Context) ([]byte, error) {
				if err := insertNote(ctx, table, "stale"); err != nil {
					return nil, err
				}
				close(inside)
				<-proceed
				return nil, nil
			})
			return &idemstore.Response{StatusCode: 200}, err
		})
		errc <- err
	}()
	<-inside
	// The lease ends now, in the database's clock: a stalled owner.
	f.exec(t, "UPDATE "+f.table+" SET lease_expires_at = statement_timestamp() - interval '1 second'")
	res, err := successor.Do(t.Context(), p, func(ctx context.Context) (*idemstore.Response, error) {
		_, err := idem.Step(ctx, "write", func(ctx context.Context) ([]byte, error) { return nil, insertNote(ctx, table, "successor") })
		return &idemstore.Response{StatusCode: 200}, err
	})
	if err != nil || !res.TookOver {
		t.Fatalf("successor: %v, took over %v", err, res != nil && res.TookOver)
	}
	close(proceed)
	if err := <-errc; !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Fatalf("stale owner: %v, want ErrLeaseLost", err)
	}
	if got := f.notes(t, table); len(got) != 1 || got[0] != "successor" {
		t.Errorf("rows = %q, want only the successor's", got)
	}
}

// A downstream system that checks fencing tokens (here a PostgreSQL table
// written outside idem's transaction, as another service would) refuses
// the write of a stale owner whose successor already wrote with a higher
// fence.
func TestDownstreamRefusesAStaleFence(t *testing.T) {
	t.Parallel()
	eachMode(t, testDownstreamRefusesAStaleFence)
}

func testDownstreamRefusesAStaleFence(t *testing.T, mode string) {
	f, _ := stepsFixture(t, mode)
	accounts := pgx.Identifier{f.schema, "accounts"}.Sanitize()
	f.exec(t, "CREATE TABLE "+accounts+" (id int PRIMARY KEY, balance int NOT NULL, fence bigint NOT NULL)")
	f.exec(t, "INSERT INTO "+accounts+" VALUES (1, 0, 0)")
	// The write of the example in idem.RequestInfo.Fence's documentation.
	write := func(ctx context.Context, balance int) (bool, error) {
		info, ok := idem.InfoFromContext(ctx)
		if !ok || info.Fence == 0 {
			return false, errors.New("no fence")
		}
		fence := info.Fence
		tag, err := f.pool.Exec(ctx, "UPDATE "+accounts+" SET balance = $1, fence = $2 WHERE id = 1 AND fence <= $2", balance, fence)
		return tag.RowsAffected() == 1, err
	}
	cfg := &idem.Config{Lease: time.Hour, TTL: 24 * time.Hour}
	stale, _ := idem.NewExecutor(f.store, cfg)
	successor, _ := idem.NewExecutor(f.store, cfg)
	p := idem.DoParams{Scope: "s", Key: "k", Fingerprint: "v1:x"}
	inside, proceed := make(chan struct{}), make(chan struct{})
	accepted := make(chan bool, 1)
	go func() {
		_, _ = stale.Do(context.Background(), p, func(ctx context.Context) (*idemstore.Response, error) {
			close(inside)
			<-proceed
			ok, err := write(ctx, 100)
			accepted <- ok && err == nil
			return &idemstore.Response{StatusCode: 200}, err
		})
	}()
	<-inside
	f.exec(t, "UPDATE "+f.table+" SET lease_expires_at = statement_timestamp() - interval '1 second'")
	res, err := successor.Do(t.Context(), p, func(ctx context.Context) (*idemstore.Response, error) {
		ok, err := write(ctx, 200)
		if err == nil && !ok {
			err = errors.New("the successor's write was refused")
		}
		return &idemstore.Response{StatusCode: 200}, err
	})
	if err != nil || !res.TookOver {
		t.Fatalf("successor: %v, took over %v", err, res != nil && res.TookOver)
	}
	close(proceed)
	if <-accepted {
		t.Error("the stale owner's write was accepted")
	}
	var balance int
	if err := f.pool.QueryRow(context.Background(), "SELECT balance FROM "+accounts+" WHERE id = 1").Scan(&balance); err != nil || balance != 200 {
		t.Errorf("balance = %d (%v), want the successor's 200", balance, err)
	}
}
