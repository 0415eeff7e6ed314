// Command ent is the orders service with ent: the handler creates the order
// with an ent client whose driver runs on the execution's *sql.Tx, so the
// order commits with its idempotency record, or neither does.
//
// The client in ./ent is generated from ./ent/schema and committed; after
// changing the schema, run `go generate ./examples/datalayer/ent/ent`.
//
//	go run ./examples/datalayer/ent -db orders.db
//	curl -i -X POST localhost:8103/orders -H 'Idempotency-Key: "o-1"' \
//	  -H 'Content-Type: application/json' -d '{"item":"book","quantity":1}'
package main

import (
	"context"
	"database/sql"
	"fmt"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"

	"github.com/idemhq/idem/examples/datalayer/ent/ent"
	"github.com/idemhq/idem/examples/internal/datalayer"
)

var library = datalayer.Library{Name: "ent", Open: open}

func main() { datalayer.Main("127.0.0.1:8103", library) }

// dialects are ent's names of the backends.
var dialects = map[string]string{"sqlite": dialect.SQLite, "postgres": dialect.Postgres, "mysql": dialect.MySQL}

// open picks ent's dialect for the backend. A client is cheap: each request
// makes one on the execution's transaction.
func open(db *datalayer.DB) (datalayer.Create, error) {
	d, ok := dialects[db.Backend.Name]
	if !ok {
		return nil, fmt.Errorf("ent: no dialect for %s", db.Backend.Name)
	}
	return func(ctx context.Context, tx *sql.Tx, o *datalayer.Order) error {
		// An ent client whose every query runs on the execution's transaction.
		client := ent.NewClient(ent.Driver(entsql.NewDriver(d, entsql.Conn{ExecQuerier: tx})))
		row, err := client.Order.Create().SetItem(o.Item).SetQuantity(o.Quantity).Save(ctx)
		if err != nil {
			return err
		}
		o.ID = int64(row.ID)
		return nil
	}, nil
}
