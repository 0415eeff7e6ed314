package inbox_test

import (
	"context"
	"fmt"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/memstore"
)

// A message delivered twice (a consumer crashed before its ack, or the
// publisher sent it again) is handled once; the redelivery is acknowledged
// as a replay. On sqlitestore or pgstore the handler writes through the
// execution's transaction (sqlitestore.Tx, pgstore.Tx), which commits with
// the inbox record.
func ExampleInbox_Process() {
	store, _ := memstore.New(nil)
	exec, _ := idem.NewExecutor(store, nil)
	in, _ := inbox.New(exec, inbox.Config{Name: "ledger"})

	booked := 0
	book := func(ctx context.Context, m inbox.Message) error {
		booked++
		return nil
	}
	m := inbox.Message{ID: "payment.created:pay_1", Topic: "idem.payments.created", Payload: []byte(`{"amountCents":100}`)}
	for range 2 {
		action, replayed, err := in.Process(context.Background(), m, book)
		fmt.Println(action, replayed, err)
	}
	fmt.Println("booked:", booked)
	// Output:
	// ack false <nil>
	// ack true <nil>
	// booked: 1
}
