package datalayer

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idemhq/idem/pgstore"
)

// Postgres keeps the records and the orders in one PostgreSQL database,
// through database/sql with pgx's stdlib driver (pgstore.NewDB), as GORM,
// sqlx, bun and ent open it. A search_path in the URL names the schema of
// both the orders and the records table.
var Postgres = &Backend{
	Name:   "postgres",
	Prefix: "postgres://",
	parse:  func(url string) (string, error) { return url, nil },
	open: func(ctx context.Context, url string) (*DB, error) {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			return nil, err
		}
		if cfg.ConnectTimeout == 0 {
			cfg.ConnectTimeout = 5 * time.Second
		}
		db := stdlib.OpenDB(*cfg)
		db.SetMaxOpenConns(16)
		db.SetMaxIdleConns(16) // database/sql keeps 2 by default: most requests would reconnect
		var scfg *pgstore.Config
		if schema := cfg.RuntimeParams["search_path"]; schema != "" {
			scfg = &pgstore.Config{Schema: schema}
		}
		store, err := pgstore.NewDB(ctx, db, scfg)
		if err != nil {
			db.Close()
			return nil, err
		}
		if err := createTable(ctx, db, `CREATE TABLE IF NOT EXISTS orders (
			id BIGSERIAL PRIMARY KEY,
			item TEXT NOT NULL,
			quantity BIGINT NOT NULL)`); err != nil {
			db.Close()
			return nil, err
		}
		return &DB{Store: store, SQL: db, Tx: pgstore.SQLTx, close: db.Close}, nil
	},
}
