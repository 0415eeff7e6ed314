package idemamqp_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemamqp"
	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/idemhq/idem/sqlitestore/sqliteoutbox"
)

// BenchmarkDispatch measures the dispatcher draining a SQLite outbox into
// RabbitMQ with publisher confirms (persistent messages, one durable
// queue). One op is one message.
func BenchmarkDispatch(b *testing.B) {
	f := setup(b)
	ctx := context.Background()
	st, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "o.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ob, _ := sqliteoutbox.New(st.DB(), nil)
	if err := ob.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	exec, _ := idem.NewExecutor(st, nil)
	payload := make([]byte, 200)
	for i := 0; i < b.N; i += 100 {
		if _, err := exec.Do(ctx, idem.DoParams{Scope: "fill", Key: fmt.Sprint(i), Fingerprint: "f"}, func(ctx context.Context) (*idem.Response, error) {
			for j := i; j < min(i+100, b.N); j++ {
				if err := ob.Add(ctx, outbox.Message{ID: fmt.Sprint("m-", j), Topic: f.key, Payload: payload}); err != nil {
					return nil, err
				}
			}
			return &idem.Response{StatusCode: 200}, nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	p, _ := idemamqp.NewPublisher(f.dial, idemamqp.PublisherConfig{Exchange: f.exchange, Topology: f.topology()})
	defer p.Close()
	d, err := outbox.NewDispatcher(ob, p, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	start := time.Now()
	for done := 0; done < b.N; {
		n, err := d.RunOnce(ctx)
		if err != nil {
			b.Fatal(err)
		}
		done += n
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkConsume measures a queue consumer booking messages through an
// inbox on SQLite, acknowledging each after its commit. One op is one
// message.
func BenchmarkConsume(b *testing.B) {
	f := setup(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, _ := idemamqp.NewPublisher(f.dial, idemamqp.PublisherConfig{Exchange: f.exchange, Topology: f.topology()})
	defer p.Close()
	payload := make([]byte, 200)
	for i := 0; i < b.N; i += 500 {
		var msgs []outbox.Message
		for j := i; j < min(i+500, b.N); j++ {
			msgs = append(msgs, outbox.Message{ID: fmt.Sprint("m-", j), Topic: f.key, Payload: payload})
		}
		if errs := p.Publish(ctx, msgs); errs != nil {
			b.Fatal(errs)
		}
	}
	st, err := sqlitestore.Open(ctx, filepath.Join(b.TempDir(), "in.db"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	if _, err := st.DB().ExecContext(ctx, `CREATE TABLE booked (id TEXT NOT NULL)`); err != nil {
		b.Fatal(err)
	}
	exec, _ := idem.NewExecutor(st, nil)
	in, _ := inbox.New(exec, inbox.Config{Name: "bench"})
	book := func(ctx context.Context, m inbox.Message) error {
		tx, err := sqlitestore.Tx(ctx)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO booked (id) VALUES (?)`, m.ID)
		return err
	}
	handled := make(chan struct{}, b.N)
	b.ResetTimer()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		done <- idemamqp.Consume(ctx, f.dial, f.queue, in, book, &idemamqp.ConsumeConfig{OnHandled: func(bool) { handled <- struct{}{} }})
	}()
	for range b.N {
		<-handled
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	cancel()
	<-done
}
