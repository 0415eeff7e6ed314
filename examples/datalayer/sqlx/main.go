// Command sqlx is the orders service with sqlx: the handler wraps the
// execution's *sql.Tx in a *sqlx.Tx, so the order commits with its
// idempotency record, or neither does.
//
//	go run ./examples/datalayer/sqlx -db orders.db
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

// dialects say, per backend, which driver name sqlx binds named
// parameters for, and whether the insert returns the id (MySQL has no
// RETURNING; the driver reports the id instead).
var dialects = map[string]struct {
	bindName  string
	returning bool
}{
	"sqlite":   {"sqlite3", true},
	"postgres": {"pgx", true},
	"mysql":    {"mysql", false},
}

// open wraps the application's pool in a *sqlx.DB. Its driver name only
// decides how named queries are bound; each request's writes go through
// the execution's transaction.
func open(db *datalayer.DB) (datalayer.Create, error) {
	d, ok := dialects[db.Backend.Name]
	if !ok {
		return nil, fmt.Errorf("sqlx: no bind type for %s", db.Backend.Name)
	}
	x := sqlx.NewDb(db.SQL, d.bindName)
	const insert = `INSERT INTO orders (item, quantity) VALUES (:item, :quantity)`
	return func(ctx context.Context, tx *sql.Tx, o *datalayer.Order) error {
		// The execution's transaction as a *sqlx.Tx. sqlx cannot set its
		// driver name from outside, so the *sqlx.DB binds the query.
		xtx := &sqlx.Tx{Tx: tx, Mapper: x.Mapper}
		row := Order{Item: o.Item, Quantity: o.Quantity}
		if d.returning {
			q, args, err := x.BindNamed(insert+` RETURNING id`, row)
			if err != nil {
				return err
			}
			return xtx.QueryRowxContext(ctx, q, args...).Scan(&o.ID)
		}
		res, err := sqlx.NamedExecContext(ctx, xtx, insert, row)
		if err != nil {
			return err
		}
		o.ID, err = res.LastInsertId()
		return err
	}, nil
}
