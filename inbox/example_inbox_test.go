package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/memstore"
)

// A consumer that books payments from a broker, which delivers at least
// once. A failed delivery asks for a redelivery (Retry). Once the handler
// succeeded, every redelivery of the message is acknowledged as a replay,
// and the payment is booked once. A payload the handler can never parse is
// dropped instead of being redelivered forever. On sqlitestore or pgstore
// the handler writes through the execution's transaction (sqlitestore.Tx,
// pgstore.Tx), which commits with the inbox record.
func ExampleInbox_Process() {
	store, _ := memstore.New(nil)
	exec, _ := idem.NewExecutor(store, nil)
	in, _ := inbox.New(exec, inbox.Config{Name: "ledger"})

	ledgerDown := true
	booked := 0
	book := func(ctx context.Context, m inbox.Message) error {
		var p struct{ AmountCents int }
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return fmt.Errorf("%w: %v", inbox.ErrUnprocessable, err)
		}
		if ledgerDown {
			return errors.New("ledger unavailable")
		}
		booked += p.AmountCents
		return nil
	}
	deliver := func(m inbox.Message) {
		action, replayed, err := in.Process(context.Background(), m, book)
		fmt.Println(m.ID, action, "replayed:", replayed, "error:", err)
	}

	m := inbox.Message{ID: "payment.created:pay_1", Topic: "idem.payments.created", Payload: []byte(`{"amountCents":100}`)}
	deliver(m)
	ledgerDown = false
	deliver(m) // the broker's redelivery
	deliver(m) // a duplicate: the publisher sent it twice
	deliver(inbox.Message{ID: "payment.created:pay_2", Topic: "idem.payments.created", Payload: []byte(`{"amountCents":`)})
	fmt.Println("booked cents:", booked)
	// Output:
	// payment.created:pay_1 retry replayed: false error: ledger unavailable
	// payment.created:pay_1 ack replayed: false error: <nil>
	// payment.created:pay_1 ack replayed: true error: <nil>
	// payment.created:pay_2 drop replayed: false error: inbox: message cannot be processed: unexpected end of JSON input
	// booked cents: 100
}
