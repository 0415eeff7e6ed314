// Command sqlx is the orders service with sqlx: the handler wraps the
// execution's *sql.Tx in a *sqlx.Tx, so the order commits with its
// idempotency record, or neither does.
//
//	go run ./datalayer/sqlx -db orders.db
//	curl -i -X POST localhost:8102/orders -H 'Idempotency-Key: "o-1"' \
//	  -H 'Content-Type: application/json' -d '{"item":"book","quantity":1}'
package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/idemhq/idem/examples/internal/datalayer"
)

// Order is the orders table's row, with sqlx's column tags.
type Order struct {
	ID       int64  `db:"id"`
	Item     string `db:"item"`
	Quantity int    `db:"quantity"`
}

var library = datalayer.Library{Name: "sqlx", Open: open}

func main() { datalayer.Main("127.0.0.1:8102", library) }

// bindNames are the driver names sqlx knows the placeholders of.
var bindNames = map[string]string{"sqlite": "sqlite3"}

// open wraps the application's pool in a *sqlx.DB. Its driver name only
// decides how named queries are bound; each request's writes go through
// the execution's transaction.
func open(db *datalayer.DB) (datalayer.Create, error) {
	name, ok := bindNames[db.Backend.Name]
	if !ok {
		return nil, fmt.Errorf("sqlx: no bind type for %s", db.Backend.Name)
	}
	x := sqlx.NewDb(db.SQL, name)
	return func(ctx context.Context, tx *sql.Tx, o *datalayer.Order) error {
		// The execution's transaction as a *sqlx.Tx. sqlx cannot set its
		// driver name from outside, so the *sqlx.DB binds the query.
		xtx := &sqlx.Tx{Tx: tx, Mapper: x.Mapper}
		q, args, err := x.BindNamed(`INSERT INTO orders (item, quantity) VALUES (:item, :quantity) RETURNING id`,
			Order{Item: o.Item, Quantity: o.Quantity})
		if err != nil {
			return err
		}
		return xtx.QueryRowxContext(ctx, q, args...).Scan(&o.ID)
	}, nil
}
