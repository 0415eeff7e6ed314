package pgstore_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/storetest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The whole contract holds with synchronous and with asynchronous claim
// commits (Config.AsyncClaim), and with duplicates answered by a read
// before the claim statement (Config.ReadFirst), on pgx (New) and on
// database/sql (NewDB); and whichever statement Claim starts with (the
// INSERT of a new key, or the statement that also answers duplicates).
func TestConformance(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, mode string) {
		for _, c := range []struct {
			name string
			cfg  *pgstore.Config
			pin  int // 0: Claim chooses; 1: INSERT first; 2: the duplicates' statement first
		}{
			{"sync", nil, 0},
			{"sync/insert-first", nil, 1},
			{"sync/answer-first", nil, 2},
			{"async-claim", &pgstore.Config{AsyncClaim: true}, 0},
			{"async-claim/answer-first", &pgstore.Config{AsyncClaim: true}, 2},
			{"read-first", &pgstore.Config{AsyncClaim: true, ReadFirst: true}, 0},
			{"read-first/read", &pgstore.Config{AsyncClaim: true, ReadFirst: true}, 2},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				storetest.Run(t, storetest.Harness{
					NewStore: func(t *testing.T) idemstore.Store {
						s := newFixtureIn(t, mode, c.cfg).store
						if c.pin != 0 {
							pgstore.PinClaimStatement(s, c.pin == 1)
						}
						return s
					},
					ServerClock: true,
				})
			})
		}
	})
}

// Claim starts with the INSERT of a new key while most recent claims were
// of new keys, and with the statement that also answers duplicates (with
// ReadFirst, the read) once most were duplicates; ClaimTx skips
// ReadFirst's read while most claims were new. Every answer is right
// either way.
func TestClaimStatementFollowsTraffic(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  *pgstore.Config
		tx   bool
	}{
		{"claim", nil, false},
		{"claim/read-first", &pgstore.Config{ReadFirst: true}, false},
		{"claim-tx/read-first", &pgstore.Config{ReadFirst: true}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testClaimFollowsTraffic(t, newFixture(t, c.cfg).store, c.tx)
		})
	}
}

func testClaimFollowsTraffic(t *testing.T, s *pgstore.Store, inTx bool) {
	claim := func(p idemstore.ClaimParams, want idemstore.ClaimOutcome) idemstore.ClaimResult {
		t.Helper()
		if !inTx {
			return mustClaim(t, s, p, want)
		}
		r, tx, err := s.ClaimTx(t.Context(), p)
		if err != nil {
			t.Fatalf("ClaimTx(%q): %v", p.Key, err)
		}
		if r.Outcome != want {
			t.Fatalf("ClaimTx(%q) = %v, want %v", p.Key, r.Outcome, want)
		}
		if tx != nil {
			if err := tx.Commit(t.Context()); err != nil {
				t.Fatalf("Commit of %q's claim: %v", p.Key, err)
			}
		}
		return r
	}
	newKeys := func(prefix string, n int) {
		for i := range n {
			claim(claimParams("scope", fmt.Sprintf("%s-%d", prefix, i)), idemstore.ClaimAcquired)
		}
	}
	if !pgstore.ClaimsMostlyNew(s) {
		t.Fatal("a new store does not start with the INSERT")
	}
	newKeys("a", 10)
	done := claimParams("scope", "done")
	claim(done, idemstore.ClaimAcquired)
	if err := s.Complete(t.Context(), completeParams(done, &idemstore.Response{StatusCode: 201, Body: []byte("stored")})); err != nil {
		t.Fatal(err)
	}
	replays := 0
	for pgstore.ClaimsMostlyNew(s) {
		r := claim(claimParams("scope", "done"), idemstore.ClaimCompleted)
		if string(r.Record.Response.Body) != "stored" {
			t.Fatalf("replayed %q", r.Record.Response.Body)
		}
		if replays++; replays > 100 {
			t.Fatal("100 replays in a row did not switch Claim to the statement that answers them")
		}
	}
	// Now on the duplicates' statement: replays, in-flight keys and new
	// keys are still answered right.
	claim(claimParams("scope", "done"), idemstore.ClaimCompleted)
	claim(claimParams("scope", "a-0"), idemstore.ClaimInFlight)
	news := 0
	for !pgstore.ClaimsMostlyNew(s) {
		claim(claimParams("scope", fmt.Sprintf("b-%d", news)), idemstore.ClaimAcquired)
		if news++; news > 100 {
			t.Fatal("100 new keys in a row did not switch Claim back to the INSERT")
		}
	}
}

const fpA = idem.FingerprintVersion + ":aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"

func claimParams(scope, key string) idemstore.ClaimParams {
	return idemstore.ClaimParams{Scope: scope, Key: key, Fingerprint: fpA, Token: newToken(),
		Lease: 30 * time.Second, TTL: time.Hour, Now: time.Now()}
}

func mustClaim(t *testing.T, s idemstore.Store, p idemstore.ClaimParams, want idemstore.ClaimOutcome) idemstore.ClaimResult {
	t.Helper()
	r, err := s.Claim(t.Context(), p)
	if err != nil {
		t.Fatalf("Claim(%q): %v", p.Key, err)
	}
	if r.Outcome != want {
		t.Fatalf("Claim(%q) = %v, want %v", p.Key, r.Outcome, want)
	}
	return r
}

func completeParams(p idemstore.ClaimParams, resp *idemstore.Response) idemstore.CompleteParams {
	return idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: resp, Now: time.Now()}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	pool := sharedPool(t)
	bad := map[string]pgstore.Config{
		"schema with quote":     {Schema: `idem"; DROP SCHEMA public; --`},
		"schema upper case":     {Schema: "Idem"},
		"schema starts digit":   {Schema: "1idem"},
		"schema too long":       {Schema: strings.Repeat("s", 49)},
		"table with dot":        {Table: "a.b"},
		"table with space":      {Table: "a b"},
		"table is the history":  {Table: "idem_migrations"},
		"negative max response": {MaxResponseBytes: -1},
	}
	for name, cfg := range bad {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := pgstore.New(t.Context(), pool, &cfg); err == nil {
				t.Errorf("New(%+v) succeeded", cfg)
			}
		})
	}
	if _, err := pgstore.New(t.Context(), nil, nil); err == nil {
		t.Error("New with a nil pool succeeded")
	}
}

// noDriver is a database/sql driver that is not pgx's.
type noDriver struct{}

func (noDriver) Open(string) (driver.Conn, error) { return nil, errors.New("not a database") }

func init() { sql.Register("idemtest-nodriver", noDriver{}) }

func TestNewDBRejectsOtherDrivers(t *testing.T) {
	t.Parallel()
	if _, err := pgstore.NewDB(t.Context(), nil, nil); err == nil {
		t.Error("NewDB with a nil *sql.DB succeeded")
	}
	db, err := sql.Open("idemtest-nodriver", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := pgstore.NewDB(t.Context(), db, nil); err == nil || !strings.Contains(err.Error(), "pgx") {
		t.Errorf("NewDB on another driver: %v, want an error naming pgx's driver", err)
	}
	if _, err := pgstore.NewDB(t.Context(), sharedSQL(t), &pgstore.Config{Schema: "Bad"}); err == nil {
		t.Error("NewDB with a bad schema name succeeded")
	}
}

// Eight instances starting at once on an empty schema: all succeed, the
// migration is recorded once, and the table works. Also without the
// advisory lock, as on CockroachDB and YugabyteDB: idempotent DDL and
// retries must converge on their own.
func TestConcurrentMigrations(t *testing.T) {
	t.Parallel()
	newFuncs := map[string]func(context.Context, *pgxpool.Pool, *pgstore.Config) (*pgstore.Store, error){
		"advisory lock":    pgstore.New,
		"no advisory lock": pgstore.NewWithoutAdvisoryLock,
	}
	for name, newStore := range newFuncs {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pool := sharedPool(t)
			schema := freshSchema(t, pool)
			const n = 8
			stores := make([]*pgstore.Store, n)
			errs := make([]error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					stores[i], errs[i] = newStore(t.Context(), pool, &pgstore.Config{Schema: schema})
				}()
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("New #%d: %v", i, err)
				}
			}
			f := &fixture{pool: pool, schema: schema}
			if got := f.count(t, "SELECT count(*) FROM "+schema+".idem_migrations WHERE table_name = $1", pgstore.DefaultTable); got != pgstore.Migrations {
				t.Errorf("%d migration rows, want %d", got, pgstore.Migrations)
			}
			for i, s := range stores {
				mustClaim(t, s, claimParams("scope", fmt.Sprint("k", i)), idemstore.ClaimAcquired)
			}
		})
	}
}

// A second New on a migrated schema changes nothing, and SkipMigrate issues
// no statement: it works on a migrated schema and leaves a missing one
// missing.
func TestNewOnMigratedSchemaAndSkipMigrate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	p := claimParams("scope", "k")
	mustClaim(t, f.store, p, idemstore.ClaimAcquired)
	again, err := pgstore.New(t.Context(), f.pool, &pgstore.Config{Schema: f.schema})
	if err != nil {
		t.Fatalf("second New: %v", err)
	}
	mustClaim(t, again, claimParams("scope", "k"), idemstore.ClaimInFlight)
	skip, err := pgstore.New(t.Context(), f.pool, &pgstore.Config{Schema: f.schema, SkipMigrate: true})
	if err != nil {
		t.Fatalf("New with SkipMigrate: %v", err)
	}
	mustClaim(t, skip, claimParams("scope", "k"), idemstore.ClaimInFlight)

	// Another table in the same schema gets its own history row.
	other, err := pgstore.New(t.Context(), f.pool, &pgstore.Config{Schema: f.schema, Table: "other_records"})
	if err != nil {
		t.Fatalf("New with another table: %v", err)
	}
	mustClaim(t, other, claimParams("scope", "k"), idemstore.ClaimAcquired)
	if got := f.count(t, "SELECT count(*) FROM "+f.schema+".idem_migrations"); got != 2*pgstore.Migrations {
		t.Errorf("%d migration rows for two tables, want %d", got, 2*pgstore.Migrations)
	}

	missing := freshSchema(t, f.pool)
	if _, err := pgstore.New(t.Context(), f.pool, &pgstore.Config{Schema: missing, SkipMigrate: true}); err != nil {
		t.Fatalf("New with SkipMigrate on a missing schema: %v", err)
	}
	if n := f.count(t, "SELECT count(*) FROM pg_namespace WHERE nspname = $1", missing); n != 0 {
		t.Error("New with SkipMigrate created the schema")
	}
}

// MaxResponseBytes bounds the body: above it Complete (and CompleteTx)
// return ErrResponseTooLarge and the record stays in flight, still owned.
func TestResponseTooLarge(t *testing.T) {
	t.Parallel()
	eachMode(t, testResponseTooLarge)
}

func testResponseTooLarge(t *testing.T, mode string) {
	f := newFixtureIn(t, mode, &pgstore.Config{MaxResponseBytes: 1000})
	p := claimParams("scope", "k")
	mustClaim(t, f.store, p, idemstore.ClaimAcquired)
	big := &idemstore.Response{StatusCode: 200, Body: make([]byte, 1001)}
	if err := f.store.Complete(t.Context(), completeParams(p, big)); !errors.Is(err, idemstore.ErrResponseTooLarge) {
		t.Fatalf("Complete of 1001 bytes: %v, want ErrResponseTooLarge", err)
	}
	tx := f.begin(t)
	err := tx.complete(t.Context(), completeParams(p, big))
	_ = tx.rollback(t.Context())
	if !errors.Is(err, idemstore.ErrResponseTooLarge) {
		t.Fatalf("CompleteTx of 1001 bytes: %v, want ErrResponseTooLarge", err)
	}
	huge := &idemstore.Response{StatusCode: 200, Header: map[string][]string{"X-Big": {strings.Repeat("h", 70<<10)}}}
	if err := f.store.Complete(t.Context(), completeParams(p, huge)); !errors.Is(err, idemstore.ErrResponseTooLarge) {
		t.Fatalf("Complete with 70 KiB of header: %v, want ErrResponseTooLarge", err)
	}
	mustClaim(t, f.store, claimParams("scope", "k"), idemstore.ClaimInFlight)
	fits := &idemstore.Response{StatusCode: 200, Body: make([]byte, 1000)}
	if err := f.store.Complete(t.Context(), completeParams(p, fits)); err != nil {
		t.Fatalf("Complete of 1000 bytes: %v", err)
	}
	r := mustClaim(t, f.store, claimParams("scope", "k"), idemstore.ClaimCompleted)
	if len(r.Record.Response.Body) != 1000 {
		t.Errorf("replayed %d bytes, want 1000", len(r.Record.Response.Body))
	}
}

// Two instances whose clocks differ by an hour: the one running ahead must
// not see the other's live lease as expired.
func TestSkewedExecutorsCannotStealLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	a, err := idem.NewExecutor(f.store, &idem.Config{NowFunc: time.Now})
	if err != nil {
		t.Fatal(err)
	}
	b, err := idem.NewExecutor(f.store, &idem.Config{NowFunc: func() time.Time { return time.Now().Add(time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	params := idem.DoParams{Scope: idem.Scope("t", "charge"), Key: "order-1", Fingerprint: fpA}
	started, finish := make(chan struct{}), make(chan struct{})
	runs := make(chan string, 4)
	errA := make(chan error, 1)
	go func() {
		_, err := a.Do(context.Background(), params, func(context.Context) (*idemstore.Response, error) {
			runs <- "a"
			close(started)
			<-finish
			return &idemstore.Response{StatusCode: 201, Body: []byte("charged by a")}, nil
		})
		errA <- err
	}()
	<-started
	opB := func(context.Context) (*idemstore.Response, error) {
		runs <- "b"
		return &idemstore.Response{StatusCode: 201, Body: []byte("charged by b")}, nil
	}
	if _, err := b.Do(t.Context(), params, opB); !errors.Is(err, idemstore.ErrInFlight) {
		t.Errorf("the instance an hour ahead got %v, want ErrInFlight", err)
	}
	close(finish)
	if err := <-errA; err != nil {
		t.Fatalf("instance a: %v", err)
	}
	res, err := b.Do(t.Context(), params, opB)
	if err != nil {
		t.Fatalf("instance b after completion: %v", err)
	}
	if !res.Replayed || string(res.Response.Body) != "charged by a" {
		t.Errorf("instance b got replayed=%v %q, want a's replayed response", res.Replayed, res.Response.Body)
	}
	close(runs)
	var ran []string
	for r := range runs {
		ran = append(ran, r)
	}
	if len(ran) != 1 || ran[0] != "a" {
		t.Errorf("operations run: %v, want only a's", ran)
	}
}

// 64 claims of one key through two pools, as two instances would make
// them: exactly one owner.
func TestOneOwnerAcrossPools(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	other := newPool(t, 8)
	second, err := pgstore.New(t.Context(), other, &pgstore.Config{Schema: f.schema})
	if err != nil {
		t.Fatalf("New on the second pool: %v", err)
	}
	stores := []idemstore.Store{f.store, second}
	const n = 64
	params := make([]idemstore.ClaimParams, n)
	results := make([]idemstore.ClaimResult, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		params[i] = claimParams("scope", "contended")
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			results[i], errs[i] = stores[i%2].Claim(t.Context(), params[i])
		}()
	}
	close(start)
	wg.Wait()
	acquired, inFlight := 0, 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		switch results[i].Outcome {
		case idemstore.ClaimAcquired:
			acquired++
		case idemstore.ClaimInFlight:
			inFlight++
		}
	}
	if acquired != 1 || inFlight != n-1 {
		t.Fatalf("%d acquired, %d in flight; want 1 and %d", acquired, inFlight, n-1)
	}
	owners := 0
	for i := range n {
		err := stores[(i+1)%2].Renew(t.Context(), idemstore.RenewParams{Scope: "scope", Key: "contended", Token: params[i].Token, Lease: time.Minute})
		if err == nil {
			owners++
			if results[i].Outcome != idemstore.ClaimAcquired {
				t.Errorf("claim %d saw %v but its token owns the record", i, results[i].Outcome)
			}
		} else if !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Fatalf("Renew %d: %v", i, err)
		}
	}
	if owners != 1 {
		t.Errorf("%d tokens own the record, want 1", owners)
	}
}

// Many expired records, backdated with SQL, are deleted in batches of the
// limit; live records, in flight or completed, survive.
func TestDeleteExpiredInBatches(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	const expired, live, limit = 2500, 40, 1000
	f.exec(t, `INSERT INTO `+f.table+` (scope, key, fingerprint, token, lease_expires_at, expires_at, response)
		SELECT 'old', 'k' || i, 'fp', NULL, NULL, now() - interval '1 hour' + i * interval '1 millisecond', '\x01'::bytea
		FROM generate_series(1, $1) AS i`, expired/2)
	f.exec(t, `INSERT INTO `+f.table+` (scope, key, fingerprint, token, lease_expires_at, expires_at)
		SELECT 'old-inflight', 'k' || i, 'fp', 't' || i, now() - interval '2 hours', now() - interval '1 second'
		FROM generate_series(1, $1) AS i`, expired-expired/2)
	var owned []idemstore.ClaimParams
	for i := range live {
		p := claimParams("live", fmt.Sprint("k", i))
		mustClaim(t, f.store, p, idemstore.ClaimAcquired)
		if i%2 == 0 {
			if err := f.store.Complete(t.Context(), completeParams(p, &idemstore.Response{StatusCode: 201})); err != nil {
				t.Fatal(err)
			}
		} else {
			owned = append(owned, p)
		}
	}
	var counts []int
	for {
		n, err := f.store.DeleteExpired(t.Context(), idemstore.DeleteExpiredParams{Limit: limit, Now: time.Now()})
		if err != nil {
			t.Fatalf("DeleteExpired: %v", err)
		}
		counts = append(counts, n)
		if n < limit || len(counts) > 10 {
			break
		}
	}
	if want := []int{1000, 1000, 500}; fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Errorf("batches deleted %v, want %v", counts, want)
	}
	if got := f.count(t, "SELECT count(*) FROM "+f.table); got != live {
		t.Errorf("%d records left, want the %d live ones", got, live)
	}
	for _, p := range owned {
		if err := f.store.Renew(t.Context(), idemstore.RenewParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Lease: time.Minute}); err != nil {
			t.Errorf("Renew of a live record after DeleteExpired: %v", err)
		}
	}
	if n, err := f.store.DeleteExpired(t.Context(), idemstore.DeleteExpiredParams{Limit: limit}); err != nil || n != 0 {
		t.Errorf("DeleteExpired with nothing expired = %d, %v", n, err)
	}
}

// Replays, in-flight duplicates and mismatches must not write to the
// record: no new row version (xmin unchanged) and no row lock (xmax stays
// 0), so they cost no WAL flush.
func TestReadOnlyOutcomesWriteNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	version := func(key string) string {
		var v string
		if err := f.pool.QueryRow(t.Context(), "SELECT xmin::text || '/' || xmax::text FROM "+f.table+" WHERE key = $1", key).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	inFlight := claimParams("scope", "in-flight")
	mustClaim(t, f.store, inFlight, idemstore.ClaimAcquired)
	done := claimParams("scope", "done")
	mustClaim(t, f.store, done, idemstore.ClaimAcquired)
	if err := f.store.Complete(t.Context(), completeParams(done, &idemstore.Response{StatusCode: 200, Body: []byte("ok")})); err != nil {
		t.Fatal(err)
	}
	before := map[string]string{"in-flight": version("in-flight"), "done": version("done")}
	for key, want := range map[string]idemstore.ClaimOutcome{"in-flight": idemstore.ClaimInFlight, "done": idemstore.ClaimCompleted} {
		mustClaim(t, f.store, claimParams("scope", key), want)
		q := claimParams("scope", key)
		q.Fingerprint = idem.FingerprintVersion + ":other"
		mustClaim(t, f.store, q, idemstore.ClaimMismatch)
	}
	for key, v := range before {
		if !strings.HasSuffix(v, "/0") {
			t.Fatalf("%s: xmax set before the test: %s", key, v)
		}
		if got := version(key); got != v {
			t.Errorf("%s: row version %s became %s after read-only claims", key, v, got)
		}
	}
}

// A claim whose statement snapshot misses a row committed while the
// statement waits for it must run again and report that row, not fail or
// acquire; if the other transaction rolls back, the claim acquires.
func TestClaimSeesRowCommittedDuringStatement(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	stored, _ := (&idemstore.Response{StatusCode: 201, Body: []byte("stored")}).MarshalBinary()
	cases := []struct {
		name   string
		insert string
		args   []any
		commit bool
		want   idemstore.ClaimOutcome
	}{
		{"in flight", "INSERT INTO " + f.table + " (scope, key, fingerprint, token, lease_expires_at, expires_at) VALUES ('scope', $1, $2, 'other', now() + interval '1 minute', now() + interval '1 hour')",
			nil, true, idemstore.ClaimInFlight},
		{"completed", "INSERT INTO " + f.table + " (scope, key, fingerprint, expires_at, response) VALUES ('scope', $1, $2, now() + interval '1 hour', $3)",
			[]any{stored}, true, idemstore.ClaimCompleted},
		{"rolled back", "INSERT INTO " + f.table + " (scope, key, fingerprint, token, lease_expires_at, expires_at) VALUES ('scope', $1, $2, 'other', now() + interval '1 minute', now() + interval '1 hour')",
			nil, false, idemstore.ClaimAcquired},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			key := c.name
			tx, err := f.pool.Begin(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(context.Background()) }()
			if _, err := tx.Exec(t.Context(), c.insert, append([]any{key, fpA}, c.args...)...); err != nil {
				t.Fatal(err)
			}
			var pid int
			if err := tx.QueryRow(t.Context(), "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				t.Fatal(err)
			}
			type result struct {
				r   idemstore.ClaimResult
				err error
			}
			done := make(chan result, 1)
			go func() {
				r, err := f.store.Claim(t.Context(), claimParams("scope", key))
				done <- result{r, err}
			}()
			waitForBlocked(t, f, pid)
			if c.commit {
				err = tx.Commit(t.Context())
			} else {
				err = tx.Rollback(t.Context())
			}
			if err != nil {
				t.Fatal(err)
			}
			res := <-done
			if res.err != nil {
				t.Fatalf("Claim: %v", res.err)
			}
			if res.r.Outcome != c.want {
				t.Fatalf("Claim = %v, want %v", res.r.Outcome, c.want)
			}
			if c.want == idemstore.ClaimCompleted && string(res.r.Record.Response.Body) != "stored" {
				t.Errorf("replayed %q", res.r.Record.Response.Body)
			}
		})
	}
}

// waitForBlocked polls until a backend waits for a lock that backend pid
// holds. Real time has to pass here (the claim must reach the lock), so a
// deadline bounds the polling.
func waitForBlocked(t *testing.T, f *fixture, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if f.count(t, "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))", pid) > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no backend blocked on pid %d within 10s", pid)
		}
		<-tick.C
	}
}

// Arguments the store cannot honour are refused before any statement runs,
// with an error that is not one of the contract's sentinels.
func TestClaimRejectsBadArguments(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	bad := map[string]func(*idemstore.ClaimParams){
		"zero lease":   func(p *idemstore.ClaimParams) { p.Lease = 0 },
		"negative TTL": func(p *idemstore.ClaimParams) { p.TTL = -time.Second },
		"huge key":     func(p *idemstore.ClaimParams) { p.Key = strings.Repeat("k", 3000) },
	}
	for name, mutate := range bad {
		p := claimParams("scope", "k")
		mutate(&p)
		if _, err := f.store.Claim(t.Context(), p); err == nil || errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("%s: Claim returned %v, want an argument error", name, err)
		}
	}
	if err := f.store.Renew(t.Context(), idemstore.RenewParams{Scope: "scope", Key: "k", Token: "t"}); err == nil || errors.Is(err, idemstore.ErrLeaseLost) {
		t.Errorf("Renew with a zero lease: %v, want an argument error", err)
	}
	if err := f.store.Complete(t.Context(), idemstore.CompleteParams{Scope: "scope", Key: "k", Token: "t"}); err == nil || errors.Is(err, idemstore.ErrLeaseLost) {
		t.Errorf("Complete without a response: %v, want an argument error", err)
	}
	// Nothing was written.
	if n := f.count(t, "SELECT count(*) FROM "+f.table); n != 0 {
		t.Errorf("%d records after refused calls", n)
	}
}

// The Tx of BeginTx: Native is the pgx.Tx (New) or the *sql.Tx (NewDB),
// Rollback after Commit is a no-op, and Commit makes the completion
// visible.
func TestBeginTx(t *testing.T) {
	t.Parallel()
	eachMode(t, testBeginTx)
}

func testBeginTx(t *testing.T, mode string) {
	f := newFixtureIn(t, mode, nil)
	p := claimParams("scope", "k")
	mustClaim(t, f.store, p, idemstore.ClaimAcquired)
	st, err := f.store.BeginTx(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var ok bool
	if mode == modeSQL {
		_, ok = st.Native().(*sql.Tx)
	} else {
		_, ok = st.Native().(pgx.Tx)
	}
	if !ok {
		t.Fatalf("Native() is a %T in mode %s", st.Native(), mode)
	}
	var one int
	if err := nativeQueryRow(t.Context(), st.Native(), "SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	if err := st.Complete(t.Context(), completeParams(p, &idemstore.Response{StatusCode: 204})); err != nil {
		t.Fatal(err)
	}
	if err := st.Commit(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := st.Rollback(t.Context()); err != nil {
		t.Errorf("Rollback after Commit: %v, want nil", err)
	}
	mustClaim(t, f.store, claimParams("scope", "k"), idemstore.ClaimCompleted)
}

// Version 5 replaces the in-flight index with an index of the records
// holding a recovery point: on a table of many completed records and a few
// in flight, Stuck's and Held's statements read that index, never the
// table, and find exactly the abandoned and the held records.
func TestCheckpointIndex(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := t.Context()
	idx := func(name string) int {
		return f.count(t, "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = $2", f.schema, name)
	}
	for name, want := range map[string]int{"_checkpoint_idx": 1, "_inflight_idx": 0, "_stuck_idx": 0} {
		if got := idx(pgstore.DefaultTable + name); got != want {
			t.Errorf("index %s%s: %d after migration, want %d", pgstore.DefaultTable, name, got, want)
		}
	}
	// 50,000 completed records; 30 in flight with a live lease and no
	// recovery point, 20 in flight abandoned without one; 10 suspended
	// (a recovery point, the lease ended) and 5 held.
	f.exec(t, `INSERT INTO `+f.table+` (scope, key, fingerprint, expires_at, response)
		SELECT 's', 'done' || i, 'f', statement_timestamp() + interval '1 hour', '\x00' FROM generate_series(1, 50000) i`)
	for _, r := range []struct {
		prefix, lease, checkpoint string
		n                         int
	}{
		{"live", "statement_timestamp() + interval '1 minute'", "NULL", 30},
		{"abandoned", "statement_timestamp() - interval '1 minute'", "NULL", 20},
		{"suspended", "statement_timestamp() - interval '1 minute'", `'\x01'::bytea`, 10},
		{"held", "'epoch'", `'\x01'::bytea`, 5},
	} {
		f.exec(t, `INSERT INTO `+f.table+` (scope, key, fingerprint, token, lease_expires_at, expires_at, checkpoint)
			SELECT 's', $1 || i, 'f', 't' || i, `+r.lease+`, statement_timestamp() + interval '1 hour', `+r.checkpoint+`
			FROM generate_series(1, $2) i`, r.prefix, r.n)
	}
	f.exec(t, "ANALYZE "+f.table)
	stuck, held := f.store.StuckStatements()
	for name, q := range map[string]string{"stuck": stuck, "held": held} {
		plan := explain(t, f, "EXPLAIN "+strings.ReplaceAll(q, "$1", "100"))
		if !strings.Contains(plan, "_checkpoint_idx") || strings.Contains(plan, "Seq Scan") {
			t.Errorf("%s: the plan does not read the checkpoint index alone:\n%s", name, plan)
		}
	}
	for held, want := range map[bool]int{false: 10, true: 5} {
		got, err := f.store.Stuck(ctx, idemstore.StuckParams{Limit: 100, Held: held})
		if err != nil || len(got) != want {
			t.Errorf("Stuck(Held: %v) = %d records, %v; want %d", held, len(got), err, want)
		}
	}
}

// Completions of records without a recovery point and lease renewals are
// heap-only updates (no index entry written), by pg_stat_user_tables of a
// store on a one-connection pool, whose statistics it flushes.
func TestCompletionsAreHeapOnly(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 1)
	schema := freshSchema(t, pool)
	s, err := pgstore.New(t.Context(), pool, &pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		p := claimParams("scope", fmt.Sprint("k", i))
		mustClaim(t, s, p, idemstore.ClaimAcquired)
		if err := s.Renew(t.Context(), idemstore.RenewParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(t.Context(), completeParams(p, &idemstore.Response{StatusCode: 201, Body: []byte("ok")})); err != nil {
			t.Fatal(err)
		}
	}
	// The backend flushes its statistics when it next goes idle: after
	// this statement, before it answers the next.
	if _, err := pool.Exec(t.Context(), "SELECT pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
	var upd, hot int64
	if err := pool.QueryRow(t.Context(), "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = $1::regclass",
		s.Table()).Scan(&upd, &hot); err != nil {
		t.Fatal(err)
	}
	if upd != 2*n || hot != upd {
		t.Errorf("%d updates, %d of them heap-only; want %d, all heap-only", upd, hot, 2*n)
	}
}

// Version 4 replaces the expiry B-tree with a BRIN index, and the planner
// serves DeleteExpired's batch from it on a table of many records.
func TestExpiresBRIN(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := t.Context()
	idx := func(name string) int {
		return f.count(t, "SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = $2", f.schema, name)
	}
	if idx(pgstore.DefaultTable+"_expires_at_brin") != 1 || idx(pgstore.DefaultTable+"_expires_at_idx") != 0 {
		t.Fatalf("indexes after migration: BRIN %d, B-tree %d; want 1 and 0",
			idx(pgstore.DefaultTable+"_expires_at_brin"), idx(pgstore.DefaultTable+"_expires_at_idx"))
	}
	// 50,000 live records in claim order (the first expires in an hour,
	// so that none expires before DeleteExpired on a loaded machine), then
	// analyse.
	if _, err := f.pool.Exec(ctx, "INSERT INTO "+f.store.Table()+` (scope, key, fingerprint, expires_at, response)
		SELECT 's', 'k' || i, 'f', statement_timestamp() + interval '1 hour' + i * interval '1 second', '\x00' FROM generate_series(1, 50000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := f.pool.Exec(ctx, "ANALYZE "+f.store.Table()); err != nil {
		t.Fatal(err)
	}
	plan := explain(t, f, "EXPLAIN SELECT scope, key FROM "+f.store.Table()+
		" WHERE expires_at <= statement_timestamp() LIMIT 1000 FOR UPDATE SKIP LOCKED")
	if !strings.Contains(plan, "_expires_at_brin") || strings.Contains(plan, "Seq Scan") {
		t.Errorf("DeleteExpired's batch does not use the BRIN index:\n%s", plan)
	}
	n, err := f.store.DeleteExpired(ctx, idemstore.DeleteExpiredParams{Limit: 10})
	if err != nil || n != 0 {
		t.Errorf("DeleteExpired on live records = %d, %v; want 0, nil", n, err)
	}
}

func explain(t *testing.T, f *fixture, q string) string {
	t.Helper()
	rows, err := f.pool.Query(t.Context(), q)
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// Version 6 drops the CHECK constraints that kept the two states of a
// record apart (in flight: token and lease set, no response; completed:
// the reverse). The statements keep them apart themselves: after every
// kind of write the store makes, no row mixes the two.
func TestRecordStates(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	ctx := t.Context()
	if got := f.count(t, "SELECT count(*) FROM pg_constraint WHERE conrelid = $1::regclass AND contype = 'c'", f.table); got != 0 {
		t.Errorf("%d CHECK constraints after migration, want 0", got)
	}
	resp := &idemstore.Response{StatusCode: 201, Body: []byte("ok")}
	// Claimed, renewed, with a recovery point, then completed.
	done := claimParams("s", "done")
	mustClaim(t, f.store, done, idemstore.ClaimAcquired)
	if err := f.store.Renew(ctx, idemstore.RenewParams{Scope: done.Scope, Key: done.Key, Token: done.Token, Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := f.store.SaveCheckpoint(ctx, idemstore.SaveCheckpointParams{Scope: done.Scope, Key: done.Key, Token: done.Token, Checkpoint: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	if err := f.store.Complete(ctx, completeParams(done, resp)); err != nil {
		t.Fatal(err)
	}
	// Suspended (the lease ended with a recovery point) and held.
	for _, c := range []struct {
		key       string
		end, hold bool
	}{{"suspended", true, false}, {"held", false, true}} {
		p := claimParams("s", c.key)
		mustClaim(t, f.store, p, idemstore.ClaimAcquired)
		if err := f.store.SaveCheckpoint(ctx, idemstore.SaveCheckpointParams{Scope: p.Scope, Key: p.Key, Token: p.Token,
			Checkpoint: []byte{2}, EndLease: c.end, Hold: c.hold}); err != nil {
			t.Fatal(err)
		}
	}
	// Taken over after its lease ran out, then completed by the new owner.
	took := claimParams("s", "took")
	mustClaim(t, f.store, took, idemstore.ClaimAcquired)
	f.expireLease(t, took.Scope, took.Key)
	took2 := took
	took2.Token = newToken()
	if r := mustClaim(t, f.store, took2, idemstore.ClaimAcquired); !r.TookOver {
		t.Fatal("the second claim did not take the record over")
	}
	if err := f.store.Complete(ctx, completeParams(took2, resp)); err != nil {
		t.Fatal(err)
	}
	// Claimed again after a release; claimed and completed in a
	// transaction.
	rel := claimParams("s", "released")
	mustClaim(t, f.store, rel, idemstore.ClaimAcquired)
	if err := f.store.Release(ctx, idemstore.ReleaseParams{Scope: rel.Scope, Key: rel.Key, Token: rel.Token}); err != nil {
		t.Fatal(err)
	}
	rel.Token = newToken()
	mustClaim(t, f.store, rel, idemstore.ClaimAcquired)
	txp := claimParams("s", "tx")
	r, tx, err := f.store.ClaimTx(ctx, txp)
	if err != nil || r.Outcome != idemstore.ClaimAcquired || tx == nil {
		t.Fatalf("ClaimTx = %v, %v, %v", r.Outcome, tx, err)
	}
	if err := tx.Complete(ctx, completeParams(txp, resp)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.count(t, "SELECT count(*) FROM "+f.table); got != 6 {
		t.Errorf("%d records, want 6", got)
	}
	if got := f.count(t, `SELECT count(*) FROM `+f.table+`
		WHERE (token IS NULL) <> (response IS NOT NULL) OR (token IS NULL) <> (lease_expires_at IS NULL)`); got != 0 {
		t.Errorf("%d records mix the in-flight and the completed state", got)
	}
}
