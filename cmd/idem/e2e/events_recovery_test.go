package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemhq/idem/cmd/idem/internal/events"
	"github.com/idemhq/idem/idemnats"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsServer is a private nats-server process with JetStream, on a port
// and a store directory of the test's own, that the test can kill and
// start again (on the same port), with or without its store.
type natsServer struct {
	t    *testing.T
	port int
	dir  string // the JetStream store directory (-sd)
	url  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exited
	log  *serverLog
}

// startNATSServer starts nats-server -js on a free port of 127.0.0.1, and
// stops it when the test ends. The test is skipped when nats-server is not
// installed and CI is unset.
func startNATSServer(t *testing.T) *natsServer {
	t.Helper()
	if _, err := exec.LookPath("nats-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("nats-server is not on PATH (CI is set): %v", err)
		}
		t.Skipf("nats-server is not on PATH: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &natsServer{t: t, port: port, dir: filepath.Join(t.TempDir(), "jetstream"), url: fmt.Sprintf("nats://127.0.0.1:%d", port)}
	s.start()
	t.Cleanup(s.kill)
	return s
}

// start runs the server and waits until JetStream answers.
func (s *natsServer) start() {
	s.t.Helper()
	s.mu.Lock()
	s.log = newServerLog()
	s.cmd = exec.Command("nats-server", "-a", "127.0.0.1", "-p", strconv.Itoa(s.port), "-js", "-sd", s.dir)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	killWithParent(s.cmd)
	if err := s.cmd.Start(); err != nil {
		s.mu.Unlock()
		s.t.Fatalf("start nats-server: %v", err)
	}
	done := make(chan struct{})
	s.done = done
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(done) }(s.cmd)
	s.mu.Unlock()
	eventually(s.t, 30*time.Second, 50*time.Millisecond, "nats-server with JetStream answering", func() (bool, error) {
		select {
		case <-done:
			return false, fmt.Errorf("nats-server exited: %s", s.log.tail(20))
		default:
		}
		nc, err := nats.Connect(s.url, nats.Timeout(time.Second))
		if err != nil {
			return false, err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return false, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err == nil, err
	})
}

// kill stops the server with SIGKILL, as a crash would, and waits for it.
func (s *natsServer) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// connect returns a JetStream connection to the server for the test's
// own checks, closed when the test ends. It reconnects across restarts.
func (s *natsServer) connect(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(s.url, nats.Timeout(2*time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// payN makes n payments through srv under keys prefix-from … prefix-(from+n-1),
// each answered 201, and returns their ids.
func payN(t *testing.T, srv *server, prefix string, from, n int) []string {
	t.Helper()
	ids := make([]string, 0, n)
	deadline := time.Now().Add(time.Minute)
	for i := from; i < from+n; i++ {
		id, err := payUntilCreated(t, func() *server { return srv }, fmt.Sprintf("%s-%d", prefix, i), paymentBody(100+i, fmt.Sprintf("rec-%d", i)), deadline)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// waitBooked waits until the consumer's ledger has want rows.
func waitBooked(t *testing.T, cons *server, want int64, timeout time.Duration, what string) {
	t.Helper()
	eventually(t, timeout, 50*time.Millisecond, what, func() (bool, error) {
		n, err := ledgerCount(cons)
		if err == nil && n > want {
			return false, fmt.Errorf("%d ledger rows, more than %d", n, want)
		}
		return n == want, err
	})
}

// checkBookedOnce fails the test unless the ledger at path has exactly one
// row for each payment of ids, and no other row.
func checkBookedOnce(t *testing.T, path string, ids []string) {
	t.Helper()
	db := openRO(t, path)
	if n := queryInt(t, db, "SELECT COUNT(*) FROM ledger"); n != int64(len(ids)) {
		t.Errorf("%d ledger rows, want %d", n, len(ids))
	}
	if n := queryInt(t, db, "SELECT COUNT(DISTINCT payment_id) FROM ledger"); n != int64(len(ids)) {
		t.Errorf("%d distinct payments in the ledger, want %d", n, len(ids))
	}
	for _, id := range ids {
		if n := queryInt(t, db, "SELECT COUNT(*) FROM ledger WHERE payment_id = ?", id); n != 1 {
			t.Errorf("payment %s: %d ledger rows, want 1", id, n)
		}
	}
}

// A nats-server that comes back without its JetStream state (its store
// directory deleted while it was down, as a server replaced by a fresh
// one): idem consume re-creates the stream and its durable consumer, and
// books the events published afterwards, each once.
func TestEventsNATSRecoversLostState(t *testing.T) {
	t.Parallel()
	ns := startNATSServer(t)
	subject := "e" + randomName(6) + ".payments.created"
	dir := t.TempDir()
	consumePath := dir + "/consume.db"
	srv := startServer(t, "serve", "--db", dir+"/serve.db", "--events", ns.url, "--events-subject", subject, "--access-log=false")
	cons := startCommand(t, "consume", "consume", "--db", consumePath, "--events", ns.url, "--events-subject", subject, "--lease", "1s")

	prefix := "lost-" + randomName(4)
	ids := payN(t, srv, prefix, 0, 10)
	waitBooked(t, cons, 10, time.Minute, "10 events booked before the server is lost")

	ns.kill()
	if err := os.RemoveAll(ns.dir); err != nil {
		t.Fatal(err)
	}
	ns.start()
	began := time.Now()
	ids = append(ids, payN(t, srv, prefix, 10, 10)...)
	waitBooked(t, cons, 20, 90*time.Second, "the events published after the server lost its state booked")
	t.Logf("booked again %v after the server came back without its state", time.Since(began).Round(time.Millisecond))
	checkBookedOnce(t, consumePath, ids)

	js := ns.connect(t)
	stream, _ := idemnats.StreamFor(subject)
	if _, err := js.Consumer(testContext(t), stream, idemnats.ConsumerFor(subject)); err != nil {
		t.Errorf("the durable consumer on the new server: %v", err)
	}
	if !cons.log.contains("creating it again") {
		t.Errorf("consume did not log that it re-created its consumer; log:\n%s", cons.log.tail(30))
	}
	if r := get(t, cons, "/healthz"); r.status != http.StatusOK {
		t.Errorf("/healthz: %v", r)
	}
}

// The durable consumer deleted while idem consume runs, and then the
// whole stream: consume creates them again and books every later event
// once; the events it re-reads from the stream are replays.
func TestEventsNATSRecoversDeletedConsumer(t *testing.T) {
	t.Parallel()
	nf := newNATS(t)
	dir := t.TempDir()
	consumePath := dir + "/consume.db"
	srv := startServer(t, "serve", "--db", dir+"/serve.db", "--events", nf.url, "--events-subject", nf.subject, "--access-log=false")
	cons := startCommand(t, "consume", "consume", "--db", consumePath, "--events", nf.url, "--events-subject", nf.subject, "--lease", "1s")
	ctx := testContext(t)

	prefix := "del-" + randomName(4)
	ids := payN(t, srv, prefix, 0, 10)
	waitBooked(t, cons, 10, time.Minute, "10 events booked")

	if err := nf.js.DeleteConsumer(ctx, nf.stream, idemnats.ConsumerFor(nf.subject)); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, payN(t, srv, prefix, 10, 10)...)
	waitBooked(t, cons, 20, time.Minute, "the events after the consumer was deleted booked")
	// The re-created consumer started within the deduplication window:
	// it delivered the first 10 again, as replays.
	eventually(t, 30*time.Second, 50*time.Millisecond, "the first events replayed", func() (bool, error) {
		n, err := cons.metric("idem_consume_replayed_total")
		return n >= 10, err
	})

	// nats-server 2.9 sometimes fails to delete a stream whose consumer
	// is writing its state ("directory not empty"): try again.
	eventually(t, 30*time.Second, 100*time.Millisecond, "the stream deleted", func() (bool, error) {
		err := nf.js.DeleteStream(ctx, nf.stream)
		return err == nil || errors.Is(err, jetstream.ErrStreamNotFound), err
	})
	ids = append(ids, payN(t, srv, prefix, 20, 10)...)
	waitBooked(t, cons, 30, time.Minute, "the events after the stream was deleted booked")
	eventually(t, 30*time.Second, 50*time.Millisecond, "the consumer settled", func() (bool, error) { return nf.settled(ctx) })
	checkBookedOnce(t, consumePath, ids)
	if n := cons.mustMetric(t, "idem_consume_booked_total"); n != 30 {
		t.Errorf("idem_consume_booked_total = %v, want 30", n)
	}
}

// A consumer re-created for a ledger that has booked before starts at half
// the deduplication window (--ttl): the messages older than that, whose
// inbox records may have expired, are not delivered again (they would be
// booked twice), while the newer ones are.
func TestEventsNATSRecreatedConsumerStartsInWindow(t *testing.T) {
	t.Parallel()
	nf := newNATS(t)
	dir := t.TempDir()
	consumePath := dir + "/consume.db"
	const ttl = 4 * time.Second
	srv := startServer(t, "serve", "--db", dir+"/serve.db", "--events", nf.url, "--events-subject", nf.subject, "--access-log=false")
	cons := startCommand(t, "consume", "consume", "--db", consumePath, "--events", nf.url, "--events-subject", nf.subject,
		"--lease", "1s", "--ttl", ttl.String())
	ctx := testContext(t)

	prefix := "win-" + randomName(4)
	ids := payN(t, srv, prefix, 0, 5)
	waitBooked(t, cons, 5, time.Minute, "5 events booked")
	// Real time must pass: the records expire after --ttl.
	db := openRO(t, consumePath)
	eventually(t, 30*time.Second, 100*time.Millisecond, "the inbox records expired", func() (bool, error) {
		live := queryInt(t, db, "SELECT COUNT(*) FROM idem_records WHERE expires_at > ?", time.Now().UnixNano())
		return live == 0, fmt.Errorf("%d live records", live)
	})

	if err := nf.js.DeleteConsumer(ctx, nf.stream, idemnats.ConsumerFor(nf.subject)); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, payN(t, srv, prefix, 5, 1)...)
	waitBooked(t, cons, 6, time.Minute, "the event after the consumer was deleted booked")
	eventually(t, 30*time.Second, 50*time.Millisecond, "the consumer settled", func() (bool, error) { return nf.settled(ctx) })
	checkBookedOnce(t, consumePath, ids)
}

// The RabbitMQ queue deleted while idem consume runs, and then the queue
// and the exchange (as a broker restarted without its definitions):
// consume declares them again, and serve's events, returned as
// unroutable meanwhile, stay in the outbox and are booked once.
func TestEventsAMQPRecoversDeletedQueue(t *testing.T) {
	t.Parallel()
	af := newAMQP(t)
	dir := t.TempDir()
	consumePath := dir + "/consume.db"
	srv := startServer(t, "serve", "--db", dir+"/serve.db", "--events", af.url, "--events-subject", af.subject, "--access-log=false")
	cons := startCommand(t, "consume", "consume", "--db", consumePath, "--events", af.url, "--events-subject", af.subject, "--lease", "1s")
	exchange, queue := events.AMQPNames(af.subject)
	ch, err := af.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()

	prefix := "q-" + randomName(4)
	ids := payN(t, srv, prefix, 0, 10)
	waitBooked(t, cons, 10, time.Minute, "10 events booked")

	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, payN(t, srv, prefix, 10, 10)...)
	waitBooked(t, cons, 20, time.Minute, "the events after the queue was deleted booked")

	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDelete(exchange, false, false); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, payN(t, srv, prefix, 20, 10)...)
	waitBooked(t, cons, 30, time.Minute, "the events after the queue and exchange were deleted booked")
	if !cons.log.contains("cancelled the consumer") {
		t.Errorf("consume did not log the cancelled consumer; log:\n%s", cons.log.tail(30))
	}

	// With no consumer running, serve declares the deleted queue again
	// itself (its publishes were returned as unroutable): the events are
	// queued, and booked once consume is back.
	cons.kill(t)
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, payN(t, srv, prefix, 30, 5)...)
	serveDB := openRO(t, dir+"/serve.db")
	eventually(t, 30*time.Second, 50*time.Millisecond, "every event marked sent without a consumer", func() (bool, error) {
		n := queryInt(t, serveDB, "SELECT COUNT(*) FROM idem_outbox WHERE sent_at IS NULL")
		return n == 0, fmt.Errorf("%d unsent", n)
	})
	cons = startCommand(t, "consume-2", "consume", "--db", consumePath, "--events", af.url, "--events-subject", af.subject, "--lease", "1s")
	waitBooked(t, cons, 35, time.Minute, "the events queued while no consumer ran booked")
	checkBookedOnce(t, consumePath, ids)
	if err := ch.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		t.Log(err)
	}
}
