package cli

import (
	"context"
	"net/url"

	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/mysqlstore/mysqloutbox"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/pgstore/pgoutbox"
)

// addStore is an outbox table as serve uses it (sqliteoutbox, pgoutbox).
type addStore interface {
	outbox.Store
	Add(ctx context.Context, msgs ...outbox.Message) error
	Pending(ctx context.Context) (int64, error)
}

// newPGOutbox opens the outbox in the --db PostgreSQL database, in the
// records' schema (idem_schema, default "idem") as table "outbox".
func newPGOutbox(ctx context.Context, db *backend.Store, spec string) (addStore, error) {
	cfg := &pgoutbox.Config{}
	if u, err := url.Parse(spec); err == nil {
		cfg.Schema = u.Query().Get("idem_schema")
	}
	s, err := pgoutbox.New(db.PG, cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Migrate(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// newMySQLOutbox opens the outbox in the --db MariaDB database, as table
// idem_outbox.
func newMySQLOutbox(ctx context.Context, db *backend.Store) (addStore, error) {
	s, err := mysqloutbox.New(db.MySQL, nil)
	if err != nil {
		return nil, err
	}
	if err := s.Migrate(ctx); err != nil {
		return nil, err
	}
	return s, nil
}
