package pgoutbox_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idemhq/idem/outbox"
)

// discard is a Publisher that acknowledges everything at once: the
// benchmark measures the outbox's own statements.
type discard struct{}

func (discard) Publish(context.Context, []outbox.Message) []error { return nil }

// BenchmarkDispatch measures the PostgreSQL side of dispatching: claim a
// batch of 100 (advisory lock, UPDATE … RETURNING), mark it sent. The
// publisher acknowledges at once. One op is one message.
func BenchmarkDispatch(b *testing.B) {
	tb := setup(b, "pgx")
	payload := make([]byte, 200)
	for i := 0; i < b.N; i += 100 {
		var ms []outbox.Message
		for j := i; j < min(i+100, b.N); j++ {
			ms = append(ms, outbox.Message{ID: fmt.Sprint("m-", j), Topic: "t", Payload: payload})
		}
		if err := tb.add(b, fmt.Sprint("fill-", i), false, ms...); err != nil {
			b.Fatal(err)
		}
	}
	d, err := outbox.NewDispatcher(tb.ob, discard{}, nil)
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
