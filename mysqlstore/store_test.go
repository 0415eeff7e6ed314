package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/mysqlstore"
)

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

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	db := sharedDB(t, false)
	bad := map[string]mysqlstore.Config{
		"table with quote":      {Table: "idem`; DROP TABLE x; --"},
		"table upper case":      {Table: "Idem"},
		"table starts digit":    {Table: "1idem"},
		"table too long":        {Table: strings.Repeat("t", 49)},
		"table is the history":  {Table: "idem_migrations"},
		"negative max response": {MaxResponseBytes: -1},
		"lock wait too short":   {LockWait: time.Microsecond},
		"packet too small":      {MaxResponseBytes: 1 << 30},
	}
	for name, cfg := range bad {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if _, err := mysqlstore.New(t.Context(), db, &cfg); err == nil {
				t.Errorf("New(%+v) succeeded", cfg)
			}
		})
	}
	if _, err := mysqlstore.New(t.Context(), nil, nil); err == nil {
		t.Error("New with a nil *sql.DB succeeded")
	}
}

func TestSupportedVersion(t *testing.T) {
	t.Parallel()
	for v, ok := range map[string]bool{
		"10.11.19-MariaDB-0+deb12u1": true,
		"10.6.4-MariaDB":             true,
		"11.4.2-MariaDB-log":         true,
		"5.5.5-10.11.6-MariaDB":      true,
		"10.5.23-MariaDB":            false,
		"8.0.36":                     false,
		"8.4.0-0ubuntu0.24.04.1":     false,
		"MariaDB":                    false,
		"":                           false,
	} {
		if err := mysqlstore.SupportedVersion(v); (err == nil) != ok {
			t.Errorf("SupportedVersion(%q) = %v, want ok %v", v, err, ok)
		}
	}
}

func FuzzSupportedVersion(f *testing.F) {
	for _, s := range []string{"10.11.19-MariaDB", "8.0.36", "5.5.5-10.6.1-MariaDB", "10.x-MariaDB", "."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		if mysqlstore.SupportedVersion(v) == nil && !strings.Contains(v, "MariaDB") {
			t.Errorf("SupportedVersion(%q) accepted a server that is not MariaDB", v)
		}
	})
}

// Eight instances starting at once on a new table: all succeed, the
// migration is recorded once, and the table works.
func TestConcurrentMigrations(t *testing.T) {
	t.Parallel()
	db := sharedDB(t, false)
	table := freshTable(t, db)
	const n = 8
	stores := make([]*mysqlstore.Store, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			stores[i], errs[i] = mysqlstore.New(t.Context(), db, &mysqlstore.Config{Table: table})
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("New #%d: %v", i, err)
		}
	}
	f := &fixture{db: db, table: "`" + table + "`"}
	if got := f.count(t, "SELECT count(*) FROM idem_migrations WHERE table_name = ?", table); got != mysqlstore.Migrations {
		t.Errorf("%d migration rows, want %d", got, mysqlstore.Migrations)
	}
	for i, s := range stores {
		mustClaim(t, s, claimParams("scope", fmt.Sprint("k", i)), idemstore.ClaimAcquired)
	}
}

// SkipMigrate runs no DDL: it works on a migrated table, and leaves a
// missing one missing.
func TestSkipMigrate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	mustClaim(t, f.store, claimParams("scope", "k"), idemstore.ClaimAcquired)
	name := strings.Trim(f.table, "`")
	again, err := mysqlstore.New(t.Context(), f.db, &mysqlstore.Config{Table: name, SkipMigrate: true})
	if err != nil {
		t.Fatalf("New with SkipMigrate: %v", err)
	}
	mustClaim(t, again, claimParams("scope", "k"), idemstore.ClaimInFlight)
	missing := freshTable(t, f.db)
	s, err := mysqlstore.New(t.Context(), f.db, &mysqlstore.Config{Table: missing, SkipMigrate: true})
	if err != nil {
		t.Fatalf("New with SkipMigrate on a missing table: %v", err)
	}
	if _, err := s.Claim(t.Context(), claimParams("scope", "k")); err == nil {
		t.Error("a claim on a table SkipMigrate did not create succeeded")
	}
}

// "K" and "k" are two keys: scope and key compare as bytes, never through
// a case-insensitive collation.
func TestKeysCompareAsBytes(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	mustClaim(t, f.store, claimParams("scope", "K"), idemstore.ClaimAcquired)
	mustClaim(t, f.store, claimParams("scope", "k"), idemstore.ClaimAcquired)
	mustClaim(t, f.store, claimParams("Scope", "k"), idemstore.ClaimAcquired)
	mustClaim(t, f.store, claimParams("scope", "k "), idemstore.ClaimAcquired)
}

// A duplicate that meets an uncommitted ClaimTx answers "in progress"
// after about LockWait, not at its own (much later) deadline nor after
// InnoDB's 50-second lock wait; the operation's statements in the claim's
// transaction keep the session's lock wait.
func TestDuplicateOfUncommittedClaimWaitsLockWait(t *testing.T) {
	t.Parallel()
	f := newFixture(t, &mysqlstore.Config{LockWait: 50 * time.Millisecond})
	p := claimParams("scope", "dup")
	r, tx, err := f.store.ClaimTx(t.Context(), p)
	if err != nil || r.Outcome != idemstore.ClaimAcquired || tx == nil {
		t.Fatalf("ClaimTx = %v, tx %v, %v; want acquired with a transaction", r.Outcome, tx != nil, err)
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	var inTx, outside int
	if err := tx.Native().(*sql.Tx).QueryRowContext(t.Context(), "SELECT @@innodb_lock_wait_timeout").Scan(&inTx); err != nil {
		t.Fatal(err)
	}
	if err := f.db.QueryRowContext(t.Context(), "SELECT @@innodb_lock_wait_timeout").Scan(&outside); err != nil {
		t.Fatal(err)
	}
	if inTx != outside {
		t.Errorf("innodb_lock_wait_timeout in the claim's transaction = %d, want the session default %d", inTx, outside)
	}
	for _, claimTx := range []bool{false, true} {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		start := time.Now()
		q := p
		q.Token = newToken()
		var d idemstore.ClaimResult
		var dtx idemstore.Tx
		if claimTx {
			d, dtx, err = f.store.ClaimTx(ctx, q)
		} else {
			d, err = f.store.Claim(ctx, q)
		}
		cancel()
		if err != nil {
			t.Fatalf("duplicate (ClaimTx %v): %v", claimTx, err)
		}
		if dtx != nil || d.Outcome != idemstore.ClaimInFlight {
			t.Fatalf("duplicate (ClaimTx %v) = %v (tx %v), want in flight", claimTx, d.Outcome, dtx != nil)
		}
		if el := time.Since(start); el > 900*time.Millisecond {
			t.Errorf("the duplicate (ClaimTx %v) answered after %v; LockWait is 50ms", claimTx, el)
		}
	}
}

// frozenProxy forwards TCP connections to the test server until freeze is
// called; from then on it forwards nothing, in either direction, while
// keeping every connection open: a stalled server, not a refused one.
type frozenProxy struct {
	ln     net.Listener
	frozen chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

func newFrozenProxy(t *testing.T, target string) *frozenProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &frozenProxy{ln: ln, frozen: make(chan struct{})}
	p.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			p.wg.Go(func() { p.pipe(c, u) })
			p.wg.Go(func() { p.pipe(u, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.freeze()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *frozenProxy) freeze() { p.once.Do(func() { close(p.frozen) }) }

func (p *frozenProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.frozen:
			// Swallow everything: the peer waits for an answer that never
			// comes, until the connection is closed.
			if err != nil {
				return
			}
			continue
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				dst.Close()
			}
			return
		}
	}
}

// A stalled server: every store call returns an error within its
// context's deadline (the core's StoreTimeout), connections stay open and
// nothing answers.
func TestStalledServerFailsWithinDeadline(t *testing.T) {
	t.Parallel()
	cfg, err := mysql.ParseDSN(mysqlURL())
	if err != nil {
		t.Fatal(err)
	}
	proxy := newFrozenProxy(t, cfg.Addr)
	db, err := openDB(false, 4, func(c *mysql.Config) { c.Addr = proxy.ln.Addr().String() })
	if err != nil {
		unreachable(t, err)
	}
	t.Cleanup(func() { db.Close() })
	f := newFixtureOn(t, sharedDB(t, false), nil)
	s, err := mysqlstore.New(t.Context(), db, &mysqlstore.Config{Table: strings.Trim(f.table, "`")})
	if err != nil {
		t.Fatalf("New through the proxy: %v", err)
	}
	p := claimParams("scope", "stall")
	mustClaim(t, s, p, idemstore.ClaimAcquired)
	tx, err := s.BeginTx(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	proxy.freeze()
	calls := map[string]func(ctx context.Context) error{
		"Claim": func(ctx context.Context) error { _, err := s.Claim(ctx, claimParams("scope", "other")); return err },
		"Renew": func(ctx context.Context) error {
			return s.Renew(ctx, idemstore.RenewParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Lease: time.Minute})
		},
		"Commit": func(ctx context.Context) error {
			if err := tx.Complete(ctx, idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: &idemstore.Response{StatusCode: 200}}); err != nil {
				return err
			}
			return tx.Commit(ctx)
		},
		"DeleteExpired": func(ctx context.Context) error {
			_, err := s.DeleteExpired(ctx, idemstore.DeleteExpiredParams{Limit: 10})
			return err
		},
	}
	for name, call := range calls {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		start := time.Now()
		err := call(ctx)
		el := time.Since(start)
		cancel()
		if err == nil {
			t.Errorf("%s on a stalled server succeeded", name)
		}
		if el > 2*time.Second {
			t.Errorf("%s on a stalled server returned after %v; the deadline was 300ms", name, el)
		}
	}
}

// A take-over re-inserts the row: it keeps the record's retention and
// checkpoint, counts the attempt, and draws a larger fence.
func TestTakeOverKeepsRetentionAndCheckpoint(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	p := claimParams("scope", "take")
	first := mustClaim(t, f.store, p, idemstore.ClaimAcquired)
	if err := f.store.SaveCheckpoint(t.Context(), idemstore.SaveCheckpointParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Checkpoint: []byte("step-1")}); err != nil {
		t.Fatal(err)
	}
	f.expireLease(t, p.Scope, p.Key)
	q := claimParams("scope", "take")
	q.TTL = 10 * time.Hour
	r := mustClaim(t, f.store, q, idemstore.ClaimAcquired)
	if !r.TookOver || string(r.Record.Checkpoint) != "step-1" {
		t.Errorf("take-over = TookOver %v, checkpoint %q", r.TookOver, r.Record.Checkpoint)
	}
	if !r.Record.ExpiresAt.Equal(first.Record.ExpiresAt) {
		t.Errorf("ExpiresAt %v after the take-over, want the first claim's %v", r.Record.ExpiresAt, first.Record.ExpiresAt)
	}
	if r.Record.Fence <= first.Record.Fence {
		t.Errorf("fence %d after the take-over, not above %d", r.Record.Fence, first.Record.Fence)
	}
	if n := f.count(t, "SELECT attempt FROM "+f.table+" WHERE scope = ? AND `key` = ?", p.Scope, p.Key); n != 2 {
		t.Errorf("attempt = %d, want 2", n)
	}
	if err := f.store.Renew(t.Context(), idemstore.RenewParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Lease: time.Minute}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Errorf("the old owner's renewal: %v, want ErrLeaseLost", err)
	}
}
