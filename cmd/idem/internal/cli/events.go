package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/cmd/idem/internal/events"
	"github.com/idemhq/idem/cmd/idem/internal/payments"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/sqlitestore/sqliteoutbox"
	"github.com/prometheus/client_golang/prometheus"
)

// eventsFlags are idem serve's flags for the payment.created events.
type eventsFlags struct {
	url, subject, failReference *string
	lease                       *time.Duration
}

func (f *flags) eventsFlags() eventsFlags {
	return eventsFlags{
		url:           f.String("events", "", "publish a payment.created event for every payment to this broker:\nnats://HOST:4222 (JetStream), amqp://USER:PASS@HOST:5672/ or\nkafka://HOST:9092[,HOST:PORT...][?topic=T&partitions=N&replication=N]; the event\ncommits in the payment's transaction (an outbox) and a dispatcher\npublishes it at least once"),
		subject:       f.String("events-subject", events.DefaultSubject, "the events' NATS subject, AMQP routing key or Kafka topic"),
		lease:         f.Duration("events-lease", outbox.DefaultLease, "how long a dispatcher's claim holds events it is publishing; another\nprocess's dispatcher publishes them after it if this one died"),
		failReference: f.String("fail-reference", "", "make payments with this reference fail (500) after they were\nwritten, to show that a failed payment leaves no row and no event"),
	}
}

// check validates the flags (before anything is opened).
func (ef eventsFlags) check(sameDB bool) error {
	if *ef.url == "" {
		return nil
	}
	if *ef.lease < time.Second {
		return fmt.Errorf("--events-lease must be at least 1s, not %v", *ef.lease)
	}
	if _, err := events.BrokerOf(*ef.url); err != nil {
		return err
	}
	if err := events.ValidateSubject(*ef.subject); err != nil {
		return err
	}
	if !sameDB {
		return errors.New("--events needs the records in the --db database (no --store): the event commits in the payment's transaction")
	}
	return nil
}

// eventsRun is a running dispatcher as serve uses it.
type eventsRun struct {
	// hook adds a payment's event in the payment's transaction.
	hook func(context.Context, payments.Payment, string) error
	// wait waits for the dispatcher to stop.
	wait func()
	// notify wakes the dispatcher (after a payment committed).
	notify func()
	// collectors report the dispatcher on /metrics.
	collectors []prometheus.Collector
	// checks are the broker's readiness check (none without --events).
	checks []*readyCheck
	// outbox is the outbox for the console (nil without --events), and
	// retryNow wakes the dispatcher out of a back-off.
	outbox   outbox.Inspector
	retryNow func()
}

// after wraps next so that the dispatcher is woken once a request is
// answered (its transaction committed): events go out at once instead of
// at the next poll.
func (r eventsRun) after(next http.Handler) http.Handler {
	if r.notify == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		next.ServeHTTP(w, req)
		r.notify()
	})
}

// start sets up the outbox in db and runs its dispatcher until ctx ends.
func (ef eventsFlags) start(ctx context.Context, db *backend.Store, spec string, logger *slog.Logger) (eventsRun, error) {
	if *ef.url == "" {
		return eventsRun{wait: func() {}}, nil
	}
	var ob addStore
	switch {
	case db.SQLite != nil:
		s, err := sqliteoutbox.New(db.SQLite.DB(), nil)
		if err != nil {
			return eventsRun{}, err
		}
		if err := s.Migrate(ctx); err != nil {
			return eventsRun{}, err
		}
		ob = s
	case db.MySQL != nil:
		s, err := newMySQLOutbox(ctx, db)
		if err != nil {
			return eventsRun{}, err
		}
		ob = s
	default:
		s, err := newPGOutbox(ctx, db, spec)
		if err != nil {
			return eventsRun{}, err
		}
		ob = s
	}
	conn, err := events.Dial(ctx, *ef.url, *ef.subject, logger)
	if err != nil {
		return eventsRun{}, err
	}
	d, err := outbox.NewDispatcher(ob, conn.Publisher, &outbox.Config{Logger: logger, Lease: *ef.lease, PublishTimeout: min(outbox.DefaultPublishTimeout, *ef.lease/3)})
	if err != nil {
		conn.Close()
		return eventsRun{}, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer conn.Close()
		_ = d.Run(ctx)
	}()
	logBrokerAtStart(ctx, logger, conn, "payments are taken, and their events wait in the outbox until it answers")
	logger.Info("publishing payment events", "broker", conn.Where, "subject", conn.Topic)
	subject := conn.Topic
	hook := func(ctx context.Context, p payments.Payment, tenant string) error {
		msg, err := events.Event(subject, events.PaymentCreated{PaymentID: p.ID, Tenant: tenant, AmountCents: p.AmountCents,
			Currency: p.Currency, Reference: p.Reference, CreatedAt: p.CreatedAt})
		if err != nil {
			return err
		}
		if err := ob.Add(ctx, msg); err != nil {
			return fmt.Errorf("events: %w", err)
		}
		return nil
	}
	oi, _ := ob.(outbox.Inspector)
	return eventsRun{hook: hook, wait: func() { <-done }, notify: d.Notify, collectors: eventsCollectors(d, ob),
		checks: []*readyCheck{brokerCheck(conn, *ef.url)}, outbox: oi, retryNow: d.RetryNow}, nil
}

// eventsCollectors are the dispatcher's metrics: what it published, what
// failed, and how many events wait in the outbox (the lag an operator
// watches while the broker is down).
func eventsCollectors(d *outbox.Dispatcher, ob addStore) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "idem_events_published_total",
			Help: "Events the broker acknowledged."}, func() float64 { return float64(d.Stats().Published) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "idem_events_publish_failures_total",
			Help: "Event publish attempts that failed (retried with back-off)."}, func() float64 { return float64(d.Stats().Failed) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "idem_events_pending",
			Help: "Committed events not yet acknowledged by the broker (-1 if the database did not answer)."}, func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			n, err := ob.Pending(ctx)
			if err != nil {
				return -1
			}
			return float64(n)
		}),
	}
}
