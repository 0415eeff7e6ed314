// Package pgstore is an idemstore.Store on PostgreSQL: the store to use when
// several instances of a service, behind a load balancer, must share one
// idempotency truth, and when business writes and the stored response must
// commit in one transaction.
//
// # Use
//
//	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	...
//	store, err := pgstore.New(ctx, pool, nil) // creates or migrates schema "idem"
//	...
//	mw, err := idem.NewMiddleware(store, nil)
//
// Inside a handler, pgstore.Tx(r.Context()) returns the execution's
// transaction; writes made through it commit together with the stored
// response (see Tx and Store.CompleteTx).
//
// # database/sql
//
// A program that reaches PostgreSQL through database/sql (GORM, sqlx, bun,
// ent and sqlc all do) opens its *sql.DB with pgx's stdlib driver and
// passes it to NewDB:
//
//	db, err := sql.Open("pgx", os.Getenv("DATABASE_URL")) // import _ "github.com/jackc/pgx/v5/stdlib"
//	...
//	store, err := pgstore.NewDB(ctx, db, nil)
//
// Inside a handler, SQLTx returns the execution's *sql.Tx:
//
//	tx, err := pgstore.SQLTx(r.Context())
//
// Hand it to the data layer; its writes commit with the stored response.
// Everything else is the same as with New: the statements, ClaimTx,
// steps, fences, Inspector, encryption and pgoutbox (pgoutbox.NewDB).
// CompleteSQLTx and SaveCheckpointSQLTx take a *sql.Tx you manage. Size
// db.SetMaxIdleConns like db.SetMaxOpenConns: database/sql keeps two idle
// connections by default.
//
// It also implements idemstore.StepStore: a multi-step operation's step (see
// idem.Step) commits its writes and its recovery point in one transaction
// (Store.SaveCheckpointTx), fenced by the owner token, and every claim
// carries a fencing token drawn from a sequence, so it only grows.
//
// # Semantics
//
// The Store follows the idemstore.Store contract. Every time decision (lease,
// retention) uses the database's clock (statement_timestamp()), never the
// Now in the parameters, so instances with skewed clocks cannot steal each
// other's leases. A claim is one INSERT ... ON CONFLICT statement that
// commits on its own (DO NOTHING for a new key; a take-over runs a second
// one, DO UPDATE ... WHERE), so a duplicate sees "in flight" at once;
// replays and 409s write nothing. Renew, Complete and Release are
// fenced by the owner token and return idemstore.ErrLeaseLost when it no longer
// owns the record.
//
// # Schema
//
// New creates the schema (Config.Schema, "idem" by default), the records
// table (Config.Table, "idempotency_records") with an index on its expiry
// column and one of the records holding a recovery point (which a
// completion without one never changes, so that completions write no
// index entry: heap-only updates), and the migration history table
// idem_migrations, from versioned SQL files embedded in the package.
// Concurrent New calls are safe: a transaction-scoped advisory lock
// serialises them and every statement is idempotent. Config.SkipMigrate
// turns this off.
//
// # Cleanup
//
// Expired records behave as absent at once, but their rows stay until
// DeleteExpired removes them. Run it periodically from one or more
// instances (it skips rows that another call has locked):
//
//	for {
//		n, err := store.DeleteExpired(ctx, idemstore.DeleteExpiredParams{Limit: 5000})
//		if err != nil || n < 5000 {
//			break
//		}
//	}
//
// # Portability
//
// The SQL avoids features that PostgreSQL-compatible distributed databases
// lack: no ctid or xmax, no PL/pgSQL, no LISTEN/NOTIFY. The advisory lock
// that serialises migrations is optional: where it is missing the migration
// falls back to idempotent DDL and retries. DeleteExpired relies on FOR
// UPDATE SKIP LOCKED (CockroachDB 23.1 and later) and two-argument unnest.
// See README.md.
package pgstore
