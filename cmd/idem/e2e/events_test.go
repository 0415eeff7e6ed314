package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem/idemnats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const defaultNATSURL = "nats://127.0.0.1:4222"

// natsFixture is a NATS connection for a test and a subject of its own
// (its own stream, deleted when the test ends).
type natsFixture struct {
	url     string
	subject string
	stream  string
	nc      *nats.Conn
	js      jetstream.JetStream
}

func newNATS(t *testing.T) *natsFixture {
	t.Helper()
	raw := envOr("IDEM_TEST_NATS_URL", defaultNATSURL)
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	requireReachable(t, "NATS", "tcp", u.Host)
	nc, err := nats.Connect(raw, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("connect to NATS: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	f := &natsFixture{url: raw, nc: nc, js: js, subject: "e" + randomName(6) + ".payments.created"}
	f.stream, _ = idemnats.StreamFor(f.subject)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, f.stream); err != nil && !strings.Contains(err.Error(), "not found") {
			t.Errorf("delete stream %s: %v", f.stream, err)
		}
		nc.Close()
	})
	return f
}

// hostPort returns the broker's host:port.
func (f *natsFixture) hostPort(t *testing.T) string {
	u, err := url.Parse(f.url)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// settled reports whether the test consumer has nothing left to deliver or
// to be acknowledged.
func (f *natsFixture) settled(ctx context.Context) (bool, error) {
	c, err := f.js.Consumer(ctx, f.stream, idemnats.ConsumerFor(f.subject))
	if err != nil {
		return false, err
	}
	info, err := c.Info(ctx)
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.NumAckPending == 0 && info.NumRedelivered == 0, nil
}

// brokerFixture is a broker with a subject (and stream or queue) of the
// test's own.
type brokerFixture interface {
	// URL is the --events value.
	URL() string
	// Subject is the --events-subject value.
	Subject() string
	// HostPort is the broker's address, for a forwarder.
	HostPort(t *testing.T) string
	// URLVia is URL with the host and port replaced.
	URLVia(hostport string) string
	// Settled reports whether the consumer has nothing left to deliver.
	Settled(ctx context.Context) (bool, error)
}

func (f *natsFixture) URL() string                  { return f.url }
func (f *natsFixture) Subject() string              { return f.subject }
func (f *natsFixture) HostPort(t *testing.T) string { return f.hostPort(t) }
func (f *natsFixture) URLVia(hp string) string      { return replaceHost(f.url, hp) }
func (f *natsFixture) Settled(ctx context.Context) (bool, error) {
	return f.settled(ctx)
}

func replaceHost(raw, hostport string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	u.Host = hostport
	return u.String()
}

// ledgerCount returns GET /ledger/count of an idem consume.
func ledgerCount(s *server) (int64, error) {
	resp, err := httpClient.Get(s.url + "/ledger/count")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var c struct {
		Count *int64 `json:"count"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || c.Count == nil || resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /ledger/count: status %d, %v", resp.StatusCode, err)
	}
	return *c.Count, nil
}

// openRO opens a SQLite file read-only for the test's own queries.
func openRO(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func queryInt(t *testing.T, db *sql.DB, q string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.QueryRowContext(testContext(t), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// payUntilCreated pays under key until it gets 201, following the current
// server across restarts (connection errors, 409 while a killed process's
// lease runs out, 503), and returns the payment id.
func payUntilCreated(t *testing.T, current func() *server, key, body string, deadline time.Time) (string, error) {
	c := &http.Client{Timeout: 30 * time.Second}
	var last string
	for time.Now().Before(deadline) {
		r, err := pay(c, current(), key, body)
		switch {
		case err != nil:
			last = err.Error()
		case r.status == http.StatusCreated:
			var p struct{ ID string }
			if err := json.Unmarshal(r.body, &p); err != nil || p.ID == "" {
				return "", fmt.Errorf("201 without a payment id: %v", r)
			}
			return p.ID, nil
		case r.status == http.StatusConflict || r.status == http.StatusServiceUnavailable:
			last = r.String()
		default:
			return "", fmt.Errorf("unexpected reply %v", r)
		}
		time.Sleep(50 * time.Millisecond) // retry back-off, as a client would
	}
	return "", fmt.Errorf("key %s: no 201 before the deadline; last: %s", key, last)
}

// 500 payments through idem serve --events, with idem serve and idem
// consume each killed with SIGKILL three times during the run and
// restarted: the ledger ends with exactly one row per payment. Payments
// that fail after writing (--fail-reference) leave no event.
func TestEventsNATSExactlyOnceThroughKills(t *testing.T) {
	t.Parallel()
	testExactlyOnceThroughKills(t, newNATS(t), "--ack-wait", "2s")
}

func TestEventsAMQPExactlyOnceThroughKills(t *testing.T) {
	t.Parallel()
	testExactlyOnceThroughKills(t, newAMQP(t))
}

func testExactlyOnceThroughKills(t *testing.T, nf brokerFixture, consumeFlags ...string) {
	began := time.Now()
	dir := t.TempDir()
	servePath, consumePath := dir+"/serve.db", dir+"/consume.db"
	serveArgs := []string{"--db", servePath, "--events", nf.URL(), "--events-subject", nf.Subject(),
		"--lease", "2s", "--events-lease", "3s", "--access-log=false", "--fail-reference", "fail-me"}
	consumeArgs := append([]string{"--db", consumePath, "--events", nf.URL(), "--events-subject", nf.Subject(), "--lease", "1s"}, consumeFlags...)

	var mu sync.Mutex
	srv := startServer(t, "serve-0", serveArgs...)
	cons := startCommand(t, "consume-0", "consume", consumeArgs...)
	current := func() *server {
		mu.Lock()
		defer mu.Unlock()
		return srv
	}

	const total, workers = 500, 8
	ids := make([]string, total)
	var done atomic.Int64
	errs := make(chan error, total)
	jobs := make(chan int)
	var wg sync.WaitGroup
	deadline := time.Now().Add(3 * time.Minute)
	prefix := "ev-" + randomName(4)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				id, err := payUntilCreated(t, current, fmt.Sprintf("%s-%d", prefix, i), paymentBody(100+i, fmt.Sprintf("order-%d", i)), deadline)
				if err != nil {
					errs <- err
					continue
				}
				ids[i] = id
				done.Add(1)
			}
		}()
	}
	go func() {
		defer close(jobs)
		for i := range total {
			jobs <- i
		}
	}()

	// Kill one process or the other at points spread over the run. The
	// consumer is also killed while it works through a backlog (it was
	// down while payments went on), so that a kill lands between a
	// delivery and its acknowledgement.
	waitFor := func(at int64) {
		t.Helper()
		eventually(t, 2*time.Minute, 20*time.Millisecond, fmt.Sprintf("%d payments", at), func() (bool, error) {
			return done.Load() >= at || len(errs) > 0, nil
		})
	}
	kills := 0
	restartServe := func() {
		t.Helper()
		t.Logf("killing serve after %d payments, %v", done.Load(), time.Since(began).Round(time.Millisecond))
		current().kill(t)
		kills++
		next := startServer(t, fmt.Sprintf("serve-%d", kills), serveArgs...)
		mu.Lock()
		srv = next
		mu.Unlock()
	}
	for _, at := range []int64{60, 220, 400} {
		waitFor(at)
		restartServe()
		if at == 400 {
			break
		}
		// The consumer goes down for 60 payments, then is killed again
		// as soon as it has booked one of its backlog.
		waitFor(at + 40)
		cons.kill(t)
		waitFor(at + 100)
		before, err := ledgerCount(cons)
		if err == nil {
			t.Fatalf("the killed consumer answered (%d)", before)
		}
		counted := func() int64 {
			db := openRO(t, consumePath)
			return queryInt(t, db, "SELECT COUNT(*) FROM ledger")
		}
		base := counted()
		// Slow bookings: the backlog takes a while, and the kill lands
		// between a delivery and its acknowledgement.
		cons = startCommand(t, fmt.Sprintf("consume-%d-a", at), "consume", append(consumeArgs, "--op-delay", "20ms")...)
		eventually(t, time.Minute, time.Millisecond, "the restarted consumer booking", func() (bool, error) {
			n, err := ledgerCount(cons)
			return n > base, err
		})
		cons.kill(t)
		t.Logf("consumer killed with a backlog after %v", time.Since(began).Round(time.Millisecond))
		cons = startCommand(t, fmt.Sprintf("consume-%d-b", at), "consume", consumeArgs...)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("%d payments made through 3 kills of serve and 4 of consume after %v", total, time.Since(began).Round(time.Millisecond))

	// A payment that fails after writing its rows rolls its event back.
	for i := range 3 {
		r := mustPay(t, current(), fmt.Sprintf("%s-fail-%d", prefix, i), paymentBody(999, "fail-me"))
		if r.status != http.StatusInternalServerError {
			t.Fatalf("payment with the failing reference: %v, want 500", r)
		}
	}

	ctx := testContext(t)
	serveDB, consumeDB := openRO(t, servePath), openRO(t, consumePath)
	// Generous: in CI this test shares two cores with the rest of the
	// package's processes. A timeout says where the events were.
	eventually(t, 3*time.Minute, 100*time.Millisecond, "500 ledger rows", func() (bool, error) {
		n, err := ledgerCount(cons)
		if err != nil || n >= total {
			return n >= total, err
		}
		unsent := queryInt(t, serveDB, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
		settled, serr := nf.Settled(ctx)
		return false, fmt.Errorf("%d ledger rows, %d events still in the outbox, broker consumer settled %v (%v)", n, unsent, settled, serr)
	})
	t.Logf("%d ledger rows after %v", total, time.Since(began).Round(time.Millisecond))
	// Once the outbox is empty and the consumer has nothing pending or
	// unacknowledged, no further delivery can add a row.
	eventually(t, 60*time.Second, 100*time.Millisecond, "outbox sent and consumer settled", func() (bool, error) {
		if n := queryInt(t, serveDB, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL"); n != 0 {
			return false, fmt.Errorf("%d unsent", n)
		}
		return nf.Settled(ctx)
	})
	if n := queryInt(t, serveDB, "SELECT COUNT(*) FROM payments"); n != total {
		t.Errorf("%d payments, want %d", n, total)
	}
	if n := queryInt(t, serveDB, "SELECT COUNT(*) FROM idem_outbox"); n != total {
		t.Errorf("%d outbox messages, want %d (one per payment, none for the failed ones)", n, total)
	}
	if n := queryInt(t, consumeDB, "SELECT COUNT(*) FROM ledger"); n != total {
		t.Errorf("%d ledger rows, want %d", n, total)
	}
	if n := queryInt(t, consumeDB, "SELECT COUNT(DISTINCT payment_id) FROM ledger"); n != total {
		t.Errorf("%d distinct payments in the ledger, want %d", n, total)
	}
	if n := queryInt(t, consumeDB, "SELECT COUNT(*) FROM ledger WHERE reference = 'fail-me'"); n != 0 {
		t.Errorf("%d ledger rows for failed payments, want 0", n)
	}
	for i, id := range ids {
		if n := queryInt(t, consumeDB, "SELECT COUNT(*) FROM ledger WHERE payment_id = ? AND amount_cents = ?", id, 100+i); n != 1 {
			t.Errorf("payment %d (%s): %d ledger rows, want 1", i, id, n)
		}
	}
	// The API shows the same.
	r := get(t, cons, "/ledger?payment="+url.QueryEscape(ids[0]))
	var body struct {
		Entries []struct {
			PaymentID string `json:"paymentId"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || len(body.Entries) != 1 || body.Entries[0].PaymentID != ids[0] {
		t.Errorf("GET /ledger?payment=%s: %v (%v), want one entry", ids[0], r, err)
	}
}

// With the broker unreachable (an in-test forwarder cut), payments still
// succeed and their events wait in the outbox; once it is back, the same
// process delivers them.
func TestEventsNATSBrokerOutage(t *testing.T) {
	t.Parallel()
	testBrokerOutage(t, newNATS(t))
}

func TestEventsAMQPBrokerOutage(t *testing.T) {
	t.Parallel()
	testBrokerOutage(t, newAMQP(t))
}

func testBrokerOutage(t *testing.T, nf brokerFixture) {
	proxy := newTCPProxy(t, nf.HostPort(t))
	dir := t.TempDir()
	servePath := dir + "/serve.db"
	srv := startServer(t, "serve", "--db", servePath, "--events", nf.URLVia(proxy.addr()), "--events-subject", nf.Subject(), "--access-log=false")
	cons := startCommand(t, "consume", "consume", "--db", dir+"/consume.db", "--events", nf.URL(), "--events-subject", nf.Subject())
	serveDB := openRO(t, servePath)

	prefix := "out-" + randomName(4)
	mustCreate := func(i int) {
		t.Helper()
		if r := mustPay(t, srv, fmt.Sprintf("%s-%d", prefix, i), paymentBody(100+i, "outage")); r.status != http.StatusCreated {
			t.Fatalf("payment %d: %v", i, r)
		}
	}
	mustCreate(0)
	eventually(t, 30*time.Second, 50*time.Millisecond, "the first event booked and marked sent", func() (bool, error) {
		n, err := ledgerCount(cons)
		// The consumer may book it before the dispatcher marks it.
		return n == 1 && queryInt(t, serveDB, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL") == 0, err
	})

	proxy.cut()
	const during = 30
	for i := 1; i <= during; i++ {
		mustCreate(i)
	}
	if n := queryInt(t, serveDB, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL"); n != during {
		t.Errorf("%d events unsent while the broker is unreachable, want %d", n, during)
	}
	if n, err := ledgerCount(cons); err != nil || n != 1 {
		t.Errorf("ledger count %d (%v) while the broker is unreachable, want 1", n, err)
	}
	if n := srv.mustMetric(t, "idem_events_pending"); n != during {
		t.Errorf("idem_events_pending = %v while the broker is unreachable, want %d", n, during)
	}
	eventually(t, 30*time.Second, 50*time.Millisecond, "a failed publish counted", func() (bool, error) {
		n, err := srv.metric("idem_events_publish_failures_total")
		return n > 0, err
	})

	proxy.restore()
	eventually(t, 60*time.Second, 100*time.Millisecond, "events delivered after the broker returned", func() (bool, error) {
		n, err := ledgerCount(cons)
		return n == during+1, err
	})
	// The consumer may book an event before the dispatcher has marked it.
	eventually(t, 30*time.Second, 50*time.Millisecond, "every event marked sent", func() (bool, error) {
		return queryInt(t, serveDB, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL") == 0, nil
	})
	if n := srv.mustMetric(t, "idem_events_pending"); n != 0 {
		t.Errorf("idem_events_pending = %v after the broker returned, want 0", n)
	}
	if n := srv.mustMetric(t, "idem_events_published_total"); n < during+1 {
		t.Errorf("idem_events_published_total = %v, want at least %d", n, during+1)
	}
}

// subjectCounter counts every message published to a subject (a core NATS
// subscription sees each publish, including copies the stream drops as
// duplicates), by message id.
type subjectCounter struct {
	mu   sync.Mutex
	byID map[string]int
	all  int
}

func countSubject(t *testing.T, nf *natsFixture) *subjectCounter {
	t.Helper()
	c := &subjectCounter{byID: map[string]int{}}
	sub, err := nf.nc.Subscribe(nf.subject, func(m *nats.Msg) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.byID[m.Header.Get(jetstream.MsgIDHeader)]++
		c.all++
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := nf.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return c
}

func (c *subjectCounter) counts() (distinct, all int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byID), c.all
}

// Two idem serve processes on one SQLite file run two dispatchers on one
// outbox: in a run without faults each event is published exactly once
// (counted on the wire); when one is killed, the other publishes what it
// left, and no event is lost.
func TestEventsNATSTwoDispatchers(t *testing.T) {
	t.Parallel()
	nf := newNATS(t)
	counter := countSubject(t, nf)
	path := t.TempDir() + "/serve.db"
	args := []string{"--db", path, "--events", nf.url, "--events-subject", nf.subject, "--access-log=false", "--events-lease", "5s"}
	a := startServer(t, "serve-a", args...)
	b := startServer(t, "serve-b", args...)
	db := openRO(t, path)

	prefix := "two-" + randomName(4)
	payMany := func(from, to int, servers ...*server) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, to-from)
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := from + w; i < to; i += 4 {
					s := servers[i%len(servers)]
					key := fmt.Sprintf("%s-%d", prefix, i)
					r, err := pay(httpClient, s, key, paymentBody(100+i, "two"))
					// Two loaded processes contend for one SQLite write
					// lock, and a claim that waits longer than the store
					// timeout fails closed (503, nothing ran); a client
					// retries it with the same key.
					for try := 0; err == nil && r.status == http.StatusServiceUnavailable && try < 3; try++ {
						r, err = pay(httpClient, s, key, paymentBody(100+i, "two"))
					}
					if err == nil && r.status != http.StatusCreated {
						err = fmt.Errorf("payment %d: %v", i, r)
					}
					if err != nil {
						errs <- err
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	const first = 300
	payMany(0, first, a, b)
	eventually(t, 60*time.Second, 50*time.Millisecond, "every event published", func() (bool, error) {
		d, _ := counter.counts()
		return d == first && queryInt(t, db, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL") == 0, nil
	})
	if d, all := counter.counts(); all != d {
		t.Errorf("%d publishes of %d events without faults, want each published once", all, d)
	}

	// Kill a while it dispatches; b publishes what it left (after a's
	// claims run out).
	const second = 200
	go func() { payMany(first, first+second, b) }()
	payMany(first+second, first+2*second, a)
	a.kill(t)
	eventually(t, 60*time.Second, 50*time.Millisecond, "every event published after a dispatcher was killed", func() (bool, error) {
		d, _ := counter.counts()
		return d == first+2*second, nil
	})
	if n := queryInt(t, db, "SELECT COUNT(*) FROM payments"); n != first+2*second {
		t.Errorf("%d payments, want %d", n, first+2*second)
	}
	s, err := nf.js.Stream(testContext(t), nf.stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(testContext(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != first+2*second {
		t.Errorf("the stream holds %d messages, want %d (JetStream drops re-published ids)", info.State.Msgs, first+2*second)
	}
}

// On PostgreSQL the event commits in the payment's transaction too (the
// outbox table in the records' schema): with idem serve killed during the
// run, every payment's event is booked once and the outbox is drained.
func TestEventsPostgresOutbox(t *testing.T) {
	t.Parallel()
	testEventsSQLOutbox(t, newPGDatabase(t), "pg")
}

// The same on MariaDB (mysqloutbox, table idem_outbox in the --db
// database).
func TestEventsMySQLOutbox(t *testing.T) {
	t.Parallel()
	testEventsSQLOutbox(t, newMyDatabase(t), "mysql")
}

func testEventsSQLOutbox(t *testing.T, db sqlDatabase, name string) {
	nf := newNATS(t)
	args := []string{"--db", db.dbURL(), "--events", nf.URL(), "--events-subject", nf.Subject(), "--lease", "2s",
		"--events-lease", "3s", "--access-log=false", "--fail-reference", "fail-me"}
	var mu sync.Mutex
	srv := startServer(t, "serve-"+name+"-0", args...)
	current := func() *server { mu.Lock(); defer mu.Unlock(); return srv }
	cons := startCommand(t, "consume", "consume", "--db", t.TempDir()+"/consume.db", "--events", nf.URL(), "--events-subject", nf.Subject(), "--lease", "1s", "--ack-wait", "2s")

	const total = 60
	prefix := name + "-" + randomName(4)
	deadline := time.Now().Add(2 * time.Minute)
	for i := range total {
		if i == total/2 {
			current().kill(t)
			next := startServer(t, "serve-"+name+"-1", args...)
			mu.Lock()
			srv = next
			mu.Unlock()
		}
		if _, err := payUntilCreated(t, current, fmt.Sprintf("%s-%d", prefix, i), paymentBody(100+i, name), deadline); err != nil {
			t.Fatal(err)
		}
	}
	if r := mustPay(t, current(), prefix+"-fail", paymentBody(1, "fail-me")); r.status != http.StatusInternalServerError {
		t.Fatalf("failing payment: %v", r)
	}
	eventually(t, 60*time.Second, 100*time.Millisecond, "every event booked and marked sent", func() (bool, error) {
		n, err := ledgerCount(cons)
		if err != nil || n < total {
			return false, err
		}
		_, unsent := db.outboxRows(t)
		return unsent == 0, nil
	})
	if rows, _ := db.outboxRows(t); rows != total {
		t.Errorf("%d outbox rows, want %d (none for the failed payment)", rows, total)
	}
	if n, err := ledgerCount(cons); err != nil || n != total {
		t.Errorf("ledger count %d (%v), want %d", n, err, total)
	}
}
