package idemkafka_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemkafka"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/idemhq/idem/sqlitestore/sqliteoutbox"
)

// fillOutbox adds n messages of 200 bytes to a fresh SQLite outbox, 100
// per transaction (as n payments would, one event each), each with its own
// key (a payment id).
func fillOutbox(b *testing.B, topic string, n int) *sqliteoutbox.Store {
	b.Helper()
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "o.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	ob, _ := sqliteoutbox.New(st.DB(), nil)
	if err := ob.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	exec, _ := idem.NewExecutor(st, nil)
	payload := make([]byte, 200)
	for i := 0; i < n; i += 100 {
		if _, err := exec.Do(ctx, idem.DoParams{Scope: "fill", Key: fmt.Sprint(i), Fingerprint: "f"}, func(ctx context.Context) (*idem.Response, error) {
			for j := i; j < min(i+100, n); j++ {
				if err := ob.Add(ctx, outbox.Message{ID: fmt.Sprint("m-", j), Topic: topic, Key: fmt.Sprint("pay_", j), Payload: payload}); err != nil {
					return nil, err
				}
			}
			return &idem.Response{StatusCode: 200}, nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	return ob
}

// BenchmarkDispatch measures the dispatcher draining a SQLite outbox into
// an in-process kfake cluster (6 partitions): claim a batch, produce it,
// wait for the acknowledgements (acks=all, idempotent), mark it sent. One
// op is one message. kfake keeps records in memory: this measures the
// client and the outbox, not a Kafka broker's disks or replication.
func BenchmarkDispatch(b *testing.B) {
	c := cluster(b)
	cl := client(b, c)
	createTopic(b, cl, "bench", 6)
	ob := fillOutbox(b, "bench", b.N)
	p, err := idemkafka.NewPublisher(cl)
	if err != nil {
		b.Fatal(err)
	}
	d, err := outbox.NewDispatcher(ob, p, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for done := 0; done < b.N; {
		n, err := d.RunOnce(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		done += n
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkConsume measures a consumer group member booking records
// through an inbox on SQLite: one transaction per record (the inbox claim,
// then the booking and the record's completion), offsets committed after
// each poll. One op is one record; joining the group is not measured.
func BenchmarkConsume(b *testing.B) {
	c := cluster(b)
	cl := client(b, c)
	createTopic(b, cl, "bench", 6)
	p, err := idemkafka.NewPublisher(cl)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	payload := make([]byte, 200)
	// One record more than b.N: the consumer's first, handled before the
	// timer starts, so that joining the group is not measured.
	n := b.N + 1
	for i := 0; i < n; i += 500 {
		var msgs []outbox.Message
		for j := i; j < min(i+500, n); j++ {
			msgs = append(msgs, outbox.Message{ID: fmt.Sprint("m-", j), Topic: "bench", Key: fmt.Sprint("pay_", j), Payload: payload})
		}
		publish(b, ctx, p, msgs...)
	}
	l := newLedger(b, "bench")
	k := startConsumer(b, c, "bench", "bench", l, nil)
	k.collect(b, ctx, 1)
	b.ResetTimer()
	start := time.Now()
	k.collect(b, ctx, b.N)
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	b.StopTimer()
	if err := k.stop(b); err != nil {
		b.Fatal(err)
	}
}
