package events

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/idemhq/idem/inbox"
	"github.com/idemhq/idem/sqlitestore"
)

// Entry is one ledger row.
type Entry struct {
	Entry       int64     `json:"entry"`
	PaymentID   string    `json:"paymentId"`
	Tenant      string    `json:"tenant"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
	Reference   string    `json:"reference"`
	MessageID   string    `json:"messageId"`
	BookedAt    time.Time `json:"bookedAt"`
}

// Ledger books payment events in the SQLite file of an `idem consume`,
// next to the inbox's records. The payment id deliberately has no unique
// constraint: that a payment is booked once is the inbox's doing, and a
// duplicate would show.
type Ledger struct {
	Store *sqlitestore.Store
	// NowFunc stamps bookings. Defaults to time.Now.
	NowFunc func() time.Time
	// OpDelay makes each booking wait this long before it writes, to make
	// the window between a delivery and its acknowledgement visible in
	// demos and tests.
	OpDelay time.Duration
}

// Migrate creates the ledger table.
func (l *Ledger) Migrate(ctx context.Context) error {
	_, err := l.Store.DB().ExecContext(ctx, `
		CREATE TABLE IF NOT EXISTS ledger (
			entry        INTEGER PRIMARY KEY AUTOINCREMENT,
			payment_id   TEXT    NOT NULL,
			tenant       TEXT    NOT NULL,
			amount_cents INTEGER NOT NULL,
			currency     TEXT    NOT NULL,
			reference    TEXT    NOT NULL,
			message_id   TEXT    NOT NULL,
			booked_at    TEXT    NOT NULL
		);
		CREATE INDEX IF NOT EXISTS ledger_payment ON ledger (payment_id);`)
	if err != nil {
		return fmt.Errorf("ledger: migrate: %w", err)
	}
	return nil
}

// Book is the inbox handler: it validates the event (ParsePaymentCreated)
// and writes one ledger row through the execution's transaction, which
// commits with the inbox record. An invalid event is refused with an error
// wrapping ErrInvalidEvent, and nothing is written.
func (l *Ledger) Book(ctx context.Context, m inbox.Message) error {
	// Refused before anything is written: the error wraps
	// inbox.ErrUnprocessable, so the message is dropped, not redelivered.
	e, err := ParsePaymentCreated(m.ID, m.Payload)
	if err != nil {
		return err
	}
	if l.OpDelay > 0 {
		t := time.NewTimer(l.OpDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return context.Cause(ctx)
		}
	}
	tx, err := sqlitestore.Tx(ctx)
	if err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	now := time.Now
	if l.NowFunc != nil {
		now = l.NowFunc
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO ledger (payment_id, tenant, amount_cents, currency, reference, message_id, booked_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)`, e.PaymentID, e.Tenant, e.AmountCents, e.Currency, e.Reference, m.ID,
		now().UTC().Format(time.RFC3339Nano))
	if err != nil {
		return fmt.Errorf("ledger: book: %w", err)
	}
	return nil
}

// Booked reports whether the ledger holds any booking.
func (l *Ledger) Booked(ctx context.Context) (bool, error) {
	var booked bool
	if err := l.Store.ReadDB().QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM ledger)`).Scan(&booked); err != nil {
		return false, fmt.Errorf("ledger: %w", err)
	}
	return booked, nil
}

// Count handles GET /ledger/count: {"count":N}.
func (l *Ledger) Count(w http.ResponseWriter, r *http.Request) {
	var n int64
	if err := l.Store.ReadDB().QueryRowContext(r.Context(), `SELECT COUNT(*) FROM ledger`).Scan(&n); err != nil {
		http.Error(w, `{"error":"the ledger is unavailable"}`, http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"count\":%d}\n", n)
}

// List handles GET /ledger?payment=ID: {"entries":[...]}, the ledger rows
// of one payment (exactly one once its event was consumed).
func (l *Ledger) List(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("payment")
	if id == "" || len(id) > 200 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintln(w, `{"error":"give the payment id: /ledger?payment=ID"}`)
		return
	}
	rows, err := l.Store.ReadDB().QueryContext(r.Context(), `SELECT entry, payment_id, tenant, amount_cents, currency, reference, message_id, booked_at
		FROM ledger WHERE payment_id = ? ORDER BY entry LIMIT 100`, id)
	if err != nil {
		http.Error(w, `{"error":"the ledger is unavailable"}`, http.StatusServiceUnavailable)
		return
	}
	defer rows.Close()
	entries := []Entry{}
	for rows.Next() {
		var e Entry
		var booked string
		if err := rows.Scan(&e.Entry, &e.PaymentID, &e.Tenant, &e.AmountCents, &e.Currency, &e.Reference, &e.MessageID, &booked); err != nil {
			http.Error(w, `{"error":"the ledger is unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		e.BookedAt, _ = time.Parse(time.RFC3339Nano, booked)
		entries = append(entries, e)
	}
	if rows.Err() != nil {
		http.Error(w, `{"error":"the ledger is unavailable"}`, http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"entries": entries})
}
