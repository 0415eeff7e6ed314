package cli

import (
	"context"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/cmd/idem/internal/events"
	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/sqlitestore"
)

const consumeAbout = `Runs an example consumer of the payment.created events that
"idem serve --events" publishes: a durable consumer (NATS JetStream), queue
(RabbitMQ) or consumer group (Kafka) named after the subject books each event
into a ledger table in a SQLite file exactly once. The ledger row and the inbox record of the message
id commit in one transaction, and the broker is acknowledged (the Kafka offset committed) only after it; a
redelivered event is acknowledged without being booked again.

Each event is validated first, by the rules of the payments API; an invalid
one is logged (why, and its message id), counted on /metrics and dropped at
the broker, never booked. When the broker loses the stream and consumer
(JetStream), the queue (RabbitMQ) or the topic (Kafka), consume creates them
again and goes on.

Endpoints: GET /ledger/count ({"count":N}), GET /ledger?payment=ID
({"entries":[...]}), GET /healthz, GET /readyz (the ledger file and the broker
answer within 1s, as JSON), GET /metrics (Prometheus).`

func runConsume(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newFlags("consume", consumeAbout, stdout, stderr)
	brokerURL := f.String("events", "", "the broker to consume from: nats://HOST:4222,\namqp://USER:PASS@HOST:5672/ or kafka://HOST:9092[,HOST:PORT...][?group=G&...]\n(required)")
	subject := f.String("events-subject", events.DefaultSubject, "the events' NATS subject, AMQP routing key or Kafka topic; the durable\nconsumer, queue or consumer group is named after it")
	db := f.String("db", "ledger.db", "the SQLite file holding the ledger and the inbox records")
	addr := f.String("addr", "127.0.0.1:8081", "address to listen on (host:port; port 0 picks a free port)")
	ttl := f.Duration("ttl", idem.DefaultTTL, "how long a handled message id is remembered (the deduplication\nwindow; longer than the broker redelivers a message)")
	lease := f.Duration("lease", 5*time.Second, "how long a message being handled stays claimed without renewal (renewed\nwhile it runs); a redelivery after a crash waits this long")
	ackWait := f.Duration("ack-wait", 30*time.Second, "how long the broker waits for an acknowledgement before it delivers\na message again (JetStream; RabbitMQ redelivers when a consumer's\nconnection closes, Kafka reads from the last committed offset)")
	opDelay := f.Duration("op-delay", 0, "make each booking wait this long before it commits, to make the window\nbetween a delivery and its acknowledgement visible in demos and tests")
	logFormat := f.String("log-format", "text", "log format: text or json")
	if code, ok := f.parse(args); !ok {
		return code
	}
	if len(f.positional()) > 0 {
		return f.usageError("unexpected argument %q", f.positional()[0])
	}
	logger, err := newLogger(*logFormat, stderr)
	if err != nil {
		return f.usageError("%v", err)
	}
	if *brokerURL == "" {
		return f.usageError("--events is required (nats://HOST:4222, amqp://USER:PASS@HOST:5672/ or kafka://HOST:9092)")
	}
	if _, err := events.BrokerOf(*brokerURL); err != nil {
		return f.usageError("%v", err)
	}
	if err := events.ValidateSubject(*subject); err != nil {
		return f.usageError("%v", err)
	}
	if err := positiveDuration("ttl", *ttl, false); err != nil {
		return f.usageError("%v", err)
	}
	if err := positiveDuration("ack-wait", *ackWait, false); err != nil {
		return f.usageError("%v", err)
	}
	if err := positiveDuration("op-delay", *opDelay, true); err != nil {
		return f.usageError("%v", err)
	}
	if *lease < idem.MinLease || *ttl < *lease {
		return f.usageError("--lease must be at least %v and not longer than --ttl", idem.MinLease)
	}
	if *db == "" || *db == "memory" {
		return f.usageError("--db must be a SQLite file path")
	}

	store, err := sqlitestore.Open(ctx, *db, nil)
	if err != nil {
		logger.Error("cannot open the database", "db", *db, "error", err)
		return exitError
	}
	defer store.Close()
	ledger := &events.Ledger{Store: store, OpDelay: *opDelay}
	if err := ledger.Migrate(ctx); err != nil {
		logger.Error("cannot create the ledger table", "error", err)
		return exitError
	}
	exec, err := idem.NewExecutor(store, &idem.Config{Lease: *lease, TTL: *ttl, Logger: logger})
	if err != nil {
		return f.usageError("%v", err)
	}
	in, err := inbox.New(exec, inbox.Config{Name: *subject})
	if err != nil {
		return f.usageError("%v", err)
	}
	conn, err := events.Dial(ctx, *brokerURL, *subject, logger)
	if err != nil {
		logger.Error("cannot connect to the broker", "error", err)
		return exitError
	}
	defer conn.Close()
	conn.AckWait = *ackWait
	logBrokerAtStart(ctx, logger, conn, "consuming starts when it answers")

	mux := http.NewServeMux()
	mux.HandleFunc("GET /ledger/count", ledger.Count)
	mux.HandleFunc("GET /ledger", ledger.List)
	m := newConsumeMetrics()
	mux.Handle("GET /metrics", m.handler())
	mux.Handle("GET /readyz", newReadiness(logger, []string{*brokerURL},
		&readyCheck{name: "store", kind: string(backend.SQLite), probe: backend.SQLiteReady(store)}, brokerCheck(conn, *brokerURL)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		pctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := store.ReadDB().PingContext(pctx); err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		logger.Error("cannot listen", "addr", *addr, "error", err)
		return exitError
	}
	logger.Info("idem consume listening", "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String(),
		"broker", conn.Where, "subject", *subject, "db", *db)

	cctx, stop := context.WithCancel(ctx)
	defer stop()
	consumed := make(chan error, 1)
	go func() {
		consumed <- conn.Consume(cctx, in, ledger.Book, m.config(consumerStart(ledger, *ttl)))
		// The consumer stops only with ctx, or for good: then the
		// process exits (non-zero) rather than serve a ledger that no
		// longer grows.
		stop()
	}()
	serveErr := serveHTTP(cctx, ln, mux, logger, 0, 5*time.Second)
	stop()
	if err := <-consumed; err != nil {
		logger.Error("consumer stopped", "error", err)
		return exitError
	}
	if serveErr != nil {
		logger.Error("server stopped", "error", serveErr)
		return exitError
	}
	logger.Info("stopped")
	return exitOK
}
