package datalayer

import (
	"context"
	"strings"

	"github.com/idemhq/idem/sqlitestore"
)

// SQLite keeps the records and the orders in one SQLite file (sqlitestore).
// The application's pool is the store's single writer, so a library's
// writes and the store's queue on one connection.
var SQLite = &Backend{
	Name:   "sqlite",
	Prefix: "sqlite:",
	parse:  func(url string) (string, error) { return strings.TrimPrefix(url, "sqlite:"), nil },
	open: func(ctx context.Context, path string) (*DB, error) {
		store, err := sqlitestore.Open(ctx, path, nil)
		if err != nil {
			return nil, err
		}
		if err := createTable(ctx, store.DB(), `CREATE TABLE IF NOT EXISTS orders (
			id INTEGER PRIMARY KEY AUTOINCREMENT,
			item TEXT NOT NULL,
			quantity INTEGER NOT NULL)`); err != nil {
			store.Close()
			return nil, err
		}
		return &DB{Store: store, SQL: store.DB(), Tx: sqlitestore.Tx, close: store.Close}, nil
	},
}
