package e2e

import (
	"context"
	"database/sql"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	_ "modernc.org/sqlite" // read the SQLite file the servers share
)

// cleanupTimeout bounds each cleanup's work on a shared server.
const cleanupTimeout = 30 * time.Second

// pgDatabase is a fresh PostgreSQL database of one test.
type pgDatabase struct {
	name string
	url  string        // for --db
	pool *pgxpool.Pool // the test's own connections, for direct SQL
}

// newPGDatabase creates a database named idem_e2e_<random> through the
// admin URL (IDEM_TEST_POSTGRES_URL) and drops it, with its connections,
// when the test ends: payments and records of one test never meet
// another's, and nothing shared is truncated.
func newPGDatabase(t *testing.T) *pgDatabase {
	t.Helper()
	admin := envOr("IDEM_TEST_POSTGRES_URL", defaultPostgresURL)
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		t.Fatalf("IDEM_TEST_POSTGRES_URL: %v", err)
	}
	if strings.HasPrefix(cfg.Host, "/") {
		requireReachable(t, "PostgreSQL", "unix", filepath.Join(cfg.Host, ".s.PGSQL."+strconv.Itoa(int(cfg.Port))))
	} else {
		requireReachable(t, "PostgreSQL", "tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	}
	ctx := testContext(t)
	began := time.Now()
	name := "idem_e2e_" + randomName(6)
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("connect to PostgreSQL: %v", err)
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+name)
	conn.Close(ctx)
	if err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		began := time.Now()
		defer func() { t.Logf("database %s dropped in %v", name, time.Since(began).Round(time.Millisecond)) }()
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Errorf("drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		// FORCE ends the connections a killed server may have left.
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(admin)
	if err != nil {
		t.Fatalf("IDEM_TEST_POSTGRES_URL: %v", err)
	}
	u.Path = "/" + name
	db := &pgDatabase{name: name, url: u.String()}
	if db.pool, err = pgxpool.New(ctx, db.url); err != nil {
		t.Fatalf("connect to %s: %v", name, err)
	}
	t.Cleanup(db.pool.Close)
	t.Logf("database %s created in %v", name, time.Since(began).Round(time.Millisecond))
	return db
}

// count returns the number of payment rows.
func (db *pgDatabase) count(t *testing.T) int64 {
	t.Helper()
	var n int64
	if err := db.pool.QueryRow(testContext(t), "SELECT count(*) FROM payments").Scan(&n); err != nil {
		t.Fatalf("count payments in %s: %v", db.name, err)
	}
	return n
}

// paymentIDs returns the ids of the payment rows.
func (db *pgDatabase) paymentIDs(t *testing.T) []string {
	t.Helper()
	rows, err := db.pool.Query(testContext(t), "SELECT id FROM payments ORDER BY id")
	if err != nil {
		t.Fatalf("list payments in %s: %v", db.name, err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("list payments in %s: %v", db.name, err)
	}
	return ids
}

// redisPrefix is a key prefix of one test on the shared Redis.
type redisPrefix struct {
	prefix string
	client *redis.Client // the test's own connection
	base   *url.URL      // IDEM_TEST_REDIS_URL
}

// newRedisPrefix returns a fresh key prefix e2e-<random>: on the Redis of
// IDEM_TEST_REDIS_URL, and deletes every key under it when the test ends.
// The database is never flushed: other tests share it.
func newRedisPrefix(t *testing.T) *redisPrefix {
	t.Helper()
	raw := envOr("IDEM_TEST_REDIS_URL", defaultRedisURL)
	opts, err := redis.ParseURL(raw)
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS_URL: %v", err)
	}
	base, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS_URL: %v", err)
	}
	requireReachable(t, "Redis", "tcp", opts.Addr)
	r := &redisPrefix{prefix: "e2e-" + randomName(6) + ":", client: redis.NewClient(opts), base: base}
	if err := r.client.Ping(testContext(t)).Err(); err != nil {
		r.client.Close()
		t.Fatalf("Redis at %s: %v", opts.Addr, err)
	}
	t.Cleanup(func() {
		defer r.client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		if _, err := r.deleteKeys(ctx); err != nil {
			t.Errorf("delete keys %s*: %v", r.prefix, err)
		}
	})
	return r
}

// addr returns the Redis server's host:port.
func (r *redisPrefix) addr() string { return r.base.Host }

// storeURL returns the --store URL for the prefix, through hostport (a
// proxy) when it is not empty.
func (r *redisPrefix) storeURL(hostport string) string {
	u := *r.base
	if hostport != "" {
		u.Host = hostport
	}
	q := u.Query()
	q.Set("prefix", r.prefix)
	u.RawQuery = q.Encode()
	return u.String()
}

// keys returns the number of keys under the prefix.
func (r *redisPrefix) keys(ctx context.Context) (int, error) {
	n := 0
	iter := r.client.Scan(ctx, 0, r.prefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		n++
	}
	return n, iter.Err()
}

// deleteKeys deletes the keys under the prefix and returns how many.
func (r *redisPrefix) deleteKeys(ctx context.Context) (int, error) {
	var batch []string
	n := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := r.client.Del(ctx, batch...).Err()
		n += len(batch)
		batch = batch[:0]
		return err
	}
	iter := r.client.Scan(ctx, 0, r.prefix+"*", 500).Iterator()
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 500 {
			if err := flush(); err != nil {
				return n, err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return n, err
	}
	return n, flush()
}

// sqliteCount counts the payment rows of the SQLite file at path through
// a read-only connection of the test's own.
func sqliteCount(t *testing.T, path string) int64 {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int64
	if err := db.QueryRowContext(testContext(t), "SELECT count(*) FROM payments").Scan(&n); err != nil {
		t.Fatalf("count payments in %s: %v", path, err)
	}
	return n
}

// tcpProxy forwards TCP connections to a target, and can be cut (every
// open connection closed, new ones closed as soon as accepted) and
// restored, or frozen: connections stay open, new ones are accepted, and
// nothing is forwarded any more in either direction, as with a server (or
// a network path) that hangs. It makes a server unreachable to one process
// without touching the server, which other tests share.
type tcpProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	down  bool
	thaw  chan struct{} // non-nil while frozen; closed to thaw
	held  int           // reads withheld while frozen
	heldc chan struct{} // closed and replaced whenever held grows
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup // the accept loop and the copying goroutines

	accepted int // connections accepted so far (under mu)
}

// newTCPProxy listens on a free port of 127.0.0.1 and forwards to target
// until the test ends.
func newTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, heldc: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// addr returns the proxy's host:port.
func (p *tcpProxy) addr() string { return p.ln.Addr().String() }

func (p *tcpProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		p.accepted++
		down, frozen := p.down, p.thaw != nil
		if frozen {
			// A frozen server accepts (the kernel would) and never
			// answers.
			p.conns[c] = struct{}{}
			p.countHeld()
		}
		p.mu.Unlock()
		if down {
			c.Close()
			continue
		}
		if frozen {
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.down { // cut while dialling
			p.mu.Unlock()
			c.Close()
			up.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

// pipe copies from src to dst; when either side ends, both are closed.
// While the proxy is frozen, what it reads is held back.
func (p *tcpProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			thaw := p.thaw
			if thaw != nil {
				p.countHeld()
			}
			p.mu.Unlock()
			if thaw != nil {
				<-thaw
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
	dst.Close()
	src.Close()
}

// cut closes every forwarded connection and refuses new ones until
// restore.
func (p *tcpProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

// countHeld records one more withheld read or connection; p.mu is held.
func (p *tcpProxy) countHeld() {
	p.held++
	close(p.heldc)
	p.heldc = make(chan struct{})
}

// freeze stops forwarding: open connections stay open, new ones are
// accepted, nothing gets through, until thawed or closed.
func (p *tcpProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.thaw == nil {
		p.thaw = make(chan struct{})
	}
}

// unfreeze forwards again.
func (p *tcpProxy) unfreeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.thaw != nil {
		close(p.thaw)
		p.thaw = nil
	}
}

// waitHeld waits until the frozen proxy has withheld more than n reads or
// connections (some process is waiting on the frozen server), or fails
// the test after timeout.
func (p *tcpProxy) waitHeld(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		p.mu.Lock()
		held, changed := p.held, p.heldc
		p.mu.Unlock()
		if held > n {
			return
		}
		select {
		case <-changed:
		case <-timer.C:
			t.Fatalf("nothing reached the frozen proxy within %v", timeout)
		}
	}
}

// heldCount returns how many reads and connections were withheld so far.
func (p *tcpProxy) heldCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

// acceptedCount returns how many connections the proxy accepted so far.
func (p *tcpProxy) acceptedCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// restore forwards new connections again.
func (p *tcpProxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// close stops the proxy and waits for its goroutines.
func (p *tcpProxy) close() {
	p.ln.Close()
	p.cut()
	p.unfreeze()
	p.wg.Wait()
}
