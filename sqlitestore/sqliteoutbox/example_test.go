package sqliteoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/idemhq/idem/sqlitestore/sqliteoutbox"
)

// printer is a Publisher that prints what it publishes (use idemnats or
// idemamqp in a real program).
type printer struct{}

func (printer) Publish(_ context.Context, msgs []outbox.Message) []error {
	for _, m := range msgs {
		fmt.Printf("publish %s to %s: %s\n", m.ID, m.Topic, m.Payload)
	}
	return nil
}

// An operation adds its event in its own transaction: the event of the
// operation that failed is rolled back with it, and the dispatcher
// publishes only the committed one.
func Example() {
	dir, _ := os.MkdirTemp("", "outbox")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	store, _ := sqlitestore.Open(ctx, filepath.Join(dir, "app.db"), nil)
	defer store.Close()
	ob, _ := sqliteoutbox.New(store.DB(), nil)
	_ = ob.Migrate(ctx)
	exec, _ := idem.NewExecutor(store, nil)

	order := func(key, id string, fail bool) {
		_, err := exec.Do(ctx, idem.DoParams{Scope: "orders", Key: key, Fingerprint: id}, func(ctx context.Context) (*idem.Response, error) {
			// ... the order's rows, through sqlitestore.Tx(ctx) ...
			if err := ob.Add(ctx, outbox.Message{ID: "order.created:" + id, Topic: "shop.orders.created", Payload: []byte(`{"id":"` + id + `"}`)}); err != nil {
				return nil, err
			}
			if fail {
				return nil, errors.New("payment declined")
			}
			return &idem.Response{StatusCode: 201}, nil
		})
		fmt.Println(id, err)
	}
	order("k1", "o1", false)
	order("k2", "o2", true)

	d, _ := outbox.NewDispatcher(ob, printer{}, nil)
	_, _ = d.RunOnce(ctx) // Run(ctx) loops in a real program
	pending, _ := ob.Pending(ctx)
	fmt.Println("pending:", pending)
	// Output:
	// o1 <nil>
	// o2 payment declined
	// publish order.created:o1 to shop.orders.created: {"id":"o1"}
	// pending: 0
}
