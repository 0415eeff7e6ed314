// Command bun is the orders service with bun: the handler's insert runs on
// the execution's *sql.Tx (bun's Conn), so the order commits with its
// idempotency record, or neither does.
//
//	go run ./examples/datalayer/bun -db orders.db
//	curl -i -X POST localhost:8104/orders -H 'Idempotency-Key: "o-1"' \
//	  -H 'Content-Type: application/json' -d '{"item":"book","quantity":1}'
package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/uptrace/bun"
	"github.com/uptrace/bun/dialect/mysqldialect"
	"github.com/uptrace/bun/dialect/pgdialect"
	"github.com/uptrace/bun/dialect/sqlitedialect"
	"github.com/uptrace/bun/schema"

	"github.com/idemhq/idem/examples/internal/datalayer"
)

// Order is the bun model of the orders table.
type Order struct {
	bun.BaseModel `bun:"table:orders"`

	ID       int64  `bun:"id,pk,autoincrement"`
	Item     string `bun:"item,notnull"`
	Quantity int    `bun:"quantity,notnull"`
}

var library = datalayer.Library{Name: "bun", Open: open}

func main() { datalayer.Main("127.0.0.1:8104", library) }

// open wraps the application's pool in a *bun.DB with its backend's
// dialect. Each request's queries run on the execution's transaction.
func open(db *datalayer.DB) (datalayer.Create, error) {
	var dialect schema.Dialect
	switch db.Backend.Name {
	case "sqlite":
		dialect = sqlitedialect.New()
	case "postgres":
		dialect = pgdialect.New()
	case "mysql":
		dialect = mysqldialect.New()
	default:
		return nil, fmt.Errorf("bun: no dialect for %s", db.Backend.Name)
	}
	bdb := bun.NewDB(db.SQL, dialect)
	return func(ctx context.Context, tx *sql.Tx, o *datalayer.Order) error {
		row := Order{Item: o.Item, Quantity: o.Quantity}
		// Conn(tx): this query runs on the execution's transaction.
		if _, err := bdb.NewInsert().Conn(tx).Model(&row).Exec(ctx); err != nil {
			return err
		}
		o.ID = row.ID
		return nil
	}, nil
}
