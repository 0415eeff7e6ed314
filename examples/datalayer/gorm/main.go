// Command gorm is the orders service with GORM: the handler creates the
// order through a *gorm.DB whose connection is the execution's *sql.Tx, so
// the order commits with its idempotency record, or neither does.
//
//	go run ./examples/datalayer/gorm -db orders.db
//	curl -i -X POST localhost:8101/orders -H 'Idempotency-Key: "o-1"' \
//	  -H 'Content-Type: application/json' -d '{"item":"book","quantity":1}'
package main

import (
	"context"
	"database/sql"
	"fmt"

	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/idemhq/idem/examples/internal/datalayer"
)

// Order is the GORM model of the orders table.
type Order struct {
	ID       int64
	Item     string
	Quantity int
}

var library = datalayer.Library{Name: "gorm", Open: open}

func main() { datalayer.Main("127.0.0.1:8101", library) }

// open opens GORM on the application's pool, with the dialect of its
// backend. The pool only serves GORM's start-up query: each request's
// writes go through the execution's transaction.
func open(db *datalayer.DB) (datalayer.Create, error) {
	var dialector gorm.Dialector
	switch db.Backend.Name {
	case "sqlite":
		dialector = sqlite.New(sqlite.Config{Conn: db.SQL})
	case "postgres":
		dialector = postgres.New(postgres.Config{Conn: db.SQL})
	case "mysql":
		dialector = mysql.New(mysql.Config{Conn: db.SQL})
	default:
		return nil, fmt.Errorf("gorm: no dialector for %s", db.Backend.Name)
	}
	gdb, err := gorm.Open(dialector, &gorm.Config{
		SkipDefaultTransaction: true, // the execution's transaction is the transaction
		Logger:                 logger.Discard,
	})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, tx *sql.Tx, o *datalayer.Order) error {
		// A session whose connection is the execution's transaction, as
		// GORM's own Begin makes one on a transaction it opened.
		g := gdb.Session(&gorm.Session{NewDB: true, Context: ctx})
		g.Statement.ConnPool = tx
		row := Order{Item: o.Item, Quantity: o.Quantity}
		if err := g.Create(&row).Error; err != nil {
			return err
		}
		o.ID = row.ID
		return nil
	}, nil
}
