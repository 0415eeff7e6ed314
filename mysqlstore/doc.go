// Package mysqlstore is an idemstore.Store on MariaDB, through database/sql
// and github.com/go-sql-driver/mysql: the store for services whose data
// already lives in MariaDB, so that business writes and the stored
// response commit in one transaction there.
//
// # Use
//
//	db, err := sql.Open("mysql", "app:secret@tcp(db:3306)/shop?interpolateParams=true&timeout=5s&readTimeout=30s&writeTimeout=30s")
//	...
//	db.SetMaxOpenConns(32)
//	db.SetMaxIdleConns(32)
//	store, err := mysqlstore.New(ctx, db, nil) // creates or migrates table "idem_records"
//	...
//	mw, err := idem.NewMiddleware(store, nil)
//
// Inside a handler, mysqlstore.Tx(r.Context()) returns the execution's
// *sql.Tx; writes made through it (directly, or through a library that
// accepts a *sql.Tx) commit together with the stored response (see Tx and
// Store.CompleteTx). The Store implements idemstore.StepStore (a step's
// writes and its recovery point commit together, Store.SaveCheckpointTx),
// idemstore.TxClaimer (idem.Config.ClaimInTx) and idemstore.Inspector.
//
// # Semantics
//
// Every lease and expiry decision uses the database's clock,
// UTC_TIMESTAMP(6), never the Now in the parameters, so instances with
// skewed clocks cannot steal each other's leases. A claim of a new key is
// one INSERT that commits on its own; a duplicate is answered by a plain
// read. An expired or abandoned record is replaced in a short transaction
// that holds the row's lock. Renew, Complete and Release are fenced by the
// owner token and return idemstore.ErrLeaseLost when it no longer owns the
// record. Fences come from an AUTO_INCREMENT column: InnoDB never hands a
// value out twice and keeps its counter across restarts.
//
// # Bounded waits
//
// A claim never waits for a row lock: it asks with NOWAIT (an insert with
// innodb_lock_wait_timeout 0) and retries, backing off, for at most
// Config.LockWait (100 ms), then answers idemstore.ClaimInFlight. That is
// what a duplicate meets while a ClaimTx transaction holds an uncommitted
// claim. Every other call is bounded by its context: the driver closes the
// connection when the context ends, and commits and rollbacks are sent as
// statements bound to the context. Set the driver's readTimeout and
// writeTimeout as well (a few times idem.Config.StoreTimeout): they bound
// the calls that database/sql makes without a context, and so a stalled
// server never holds a connection forever.
//
// # DSN
//
// interpolateParams=true sends each statement in one round trip instead of
// preparing it on the server first (two round trips); both are tested.
// parseTime and loc make no difference: the store reads its times as
// integers. The store works under the server's default isolation level;
// BeginTx uses it, and the store's own short transactions use READ
// COMMITTED.
//
// # Schema
//
// New creates the records table (Config.Table, "idem_records") in the
// connection's database, and the migration history table idem_migrations,
// from versioned SQL files embedded in the package. MariaDB commits DDL
// statement by statement, so a named lock (GET_LOCK) serialises concurrent
// New calls, and every statement is idempotent. Config.SkipMigrate turns
// migration off. Scopes and keys are VARBINARY: compared as bytes, never
// case-insensitively. Scopes may be 2,048 bytes long, keys 1,024.
//
// # Cleanup
//
// Expired records behave as absent at once, but their rows stay until
// DeleteExpired removes them. Run it periodically from one or more
// instances (it skips rows that a claim has locked):
//
//	for {
//		n, err := store.DeleteExpired(ctx, idemstore.DeleteExpiredParams{Limit: 5000})
//		if err != nil || n < 5000 {
//			break
//		}
//	}
//
// # MariaDB only
//
// New refuses MySQL. The differences that matter, none of them tested
// here: MySQL has no SET STATEMENT (the claim's insert could wait
// innodb_lock_wait_timeout, 50 s by default, for an uncommitted claim), no
// INSERT ... RETURNING (the claim would need a second statement to read
// its fence and times), and reports NOWAIT failures as error 3572 rather
// than 1205. MariaDB 10.6 is the oldest release with SKIP LOCKED.
package mysqlstore
