// Package orders is the small domain the examples share: orders in a SQLite
// table of the same file as the idempotency records, written in the
// execution's transaction (the transactional pattern), so that an order
// and its stored response commit together or not at all.
package orders

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemhq/idem/sqlitestore"
)

// Order is one order.
type Order struct {
	ID        int64     `json:"id"`
	Item      string    `json:"item"`
	Quantity  int       `json:"quantity"`
	CreatedAt time.Time `json:"createdAt"`
}

// Request is the body of a create request.
type Request struct {
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

// ErrInvalid reports an invalid request.
var ErrInvalid = errors.New("send {\"item\": \"...\", \"quantity\": N} with a non-empty item and a positive quantity")

// Open opens the SQLite file holding the records and the orders.
func Open(ctx context.Context, path string) (*sqlitestore.Store, error) {
	store, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		return nil, err
	}
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (
		id INTEGER PRIMARY KEY, item TEXT NOT NULL, quantity INTEGER NOT NULL, created_at TEXT NOT NULL)`); err != nil {
		store.Close()
		return nil, err
	}
	return store, nil
}

// Parse decodes and validates a create request.
func Parse(body []byte) (Request, error) {
	var r Request
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil || strings.TrimSpace(r.Item) == "" || r.Quantity <= 0 {
		return r, ErrInvalid
	}
	return r, nil
}

// Create inserts an order in the execution's transaction: ctx must be the
// context of an idempotent execution on a sqlitestore.
func Create(ctx context.Context, r Request) (Order, error) {
	tx, err := sqlitestore.Tx(ctx)
	if err != nil {
		return Order{}, err
	}
	o := Order{Item: r.Item, Quantity: r.Quantity, CreatedAt: time.Now().UTC()}
	err = tx.QueryRowContext(ctx, `INSERT INTO orders (item, quantity, created_at) VALUES (?, ?, ?) RETURNING id`,
		o.Item, o.Quantity, o.CreatedAt.Format(time.RFC3339Nano)).Scan(&o.ID)
	if err != nil {
		return Order{}, fmt.Errorf("insert order: %w", err)
	}
	return o, nil
}

// Count returns the number of orders.
func Count(ctx context.Context, store *sqlitestore.Store) (int, error) {
	var n int
	err := store.ReadDB().QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	return n, err
}

// Tenant returns the tenant of a request: the bearer token stands in for a
// real authentication. Requests without one belong to "anonymous".
func Tenant(authorization string) string {
	if t, ok := strings.CutPrefix(authorization, "Bearer "); ok && t != "" {
		return t
	}
	return "anonymous"
}
