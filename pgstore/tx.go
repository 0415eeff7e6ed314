package pgstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore/internal/pgdb"
	"github.com/jackc/pgx/v5"
)

// CompleteTx is Complete inside the caller's transaction tx, which must be
// on the Store's database: the business writes made in tx, the owner-token
// check and the stored response commit together, or not at all. It returns
// idemstore.ErrLeaseLost if p.Token no longer owns an in-flight record (the
// record was taken over, released or has expired); the caller must then roll
// tx back, so that no business write survives a lost lease. It returns
// idemstore.ErrResponseTooLarge, executing nothing in tx, as Complete does.
//
// Call it last, just before Commit: from this statement on, tx holds the
// record's row lock, so that renewals of the record, and claims that would
// take it over, wait for the commit (duplicates that find the lease live
// answer at once without waiting).
//
// Use READ COMMITTED (PostgreSQL's default). Under REPEATABLE READ or
// SERIALIZABLE, a lease renewal committed after tx took its snapshot makes
// this update fail with a serialization error (SQLSTATE 40001), although
// the token still owns the record.
func (s *Store) CompleteTx(ctx context.Context, tx pgx.Tx, p idemstore.CompleteParams) error {
	if tx == nil {
		return errors.New("pgstore: complete in transaction: nil transaction")
	}
	return s.complete(ctx, pgdb.PgxTx{T: tx}, p, "complete in transaction")
}

// CompleteSQLTx is CompleteTx for a *sql.Tx of a Store made by NewDB.
func (s *Store) CompleteSQLTx(ctx context.Context, tx *sql.Tx, p idemstore.CompleteParams) error {
	if tx == nil {
		return errors.New("pgstore: complete in transaction: nil transaction")
	}
	return s.complete(ctx, &pgdb.SQLTx{T: tx}, p, "complete in transaction")
}

// BeginTx implements idemstore.TxStore: it begins a transaction on the Store's
// pool or *sql.DB, with the server's default isolation level. The core
// calls it lazily, when the operation first asks for its transaction (see
// Tx and SQLTx).
func (s *Store) BeginTx(ctx context.Context) (idemstore.Tx, error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("pgstore: begin: %w", err)
	}
	return &storeTx{s: s, tx: tx}, nil
}

// storeTx is the idemstore.Tx of a Store.
//
// It deliberately does not implement idemstore.TxRenewer: renewals go through
// the pool, on other connections. In PostgreSQL, row locks and MVCC let a
// renewal update the record while the business transaction is open,
// because that transaction does not touch the record until CompleteTx, its
// last statement. Renewing inside the transaction would be wrong: the
// extended lease would stay invisible to other instances until the commit,
// so they would see the old lease run out and take the record over.
type storeTx struct {
	s  *Store
	tx pgdb.Tx // a pgdb.PgxTx (New) or a *pgdb.SQLTx (NewDB)
}

func (t *storeTx) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	return t.s.complete(ctx, t.tx, p, "complete in transaction")
}

// SaveCheckpoint implements idemstore.CheckpointTx.
func (t *storeTx) SaveCheckpoint(ctx context.Context, p idemstore.SaveCheckpointParams) error {
	return t.s.saveCheckpoint(ctx, t.tx, p)
}

var _ idemstore.CheckpointTx = (*storeTx)(nil)

func (t *storeTx) Commit(ctx context.Context) error {
	if err := t.tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgstore: commit: %w", err)
	}
	return nil
}

// Rollback does nothing after Commit or an earlier Rollback, as
// idemstore.Tx requires.
func (t *storeTx) Rollback(ctx context.Context) error {
	if err := t.tx.Rollback(ctx); err != nil {
		return fmt.Errorf("pgstore: rollback: %w", err)
	}
	return nil
}

// Native returns the pgx.Tx (New) or the *sql.Tx (NewDB).
func (t *storeTx) Native() any {
	switch tx := t.tx.(type) {
	case pgdb.PgxTx:
		return tx.T
	case *pgdb.SQLTx:
		return tx.T
	}
	return nil
}

// Tx returns the transaction of the idempotent execution ctx belongs to (a
// handler's request context under idem.Middleware, or an operation's
// context in idem.Executor.Do), beginning it on first use, for a Store made
// by New. Business writes made through it commit together with the stored
// response after the handler returns and before the response is sent, and
// roll back if the handler fails (a released outcome such as a 5xx), panics
// or loses its lease. Do not commit or roll it back yourself.
//
// Outside such an execution it returns an error wrapping idem.ErrNoTx; if
// the execution's store is not a pgstore.Store made by New, an error (use
// SQLTx for one made by NewDB).
func Tx(ctx context.Context) (pgx.Tx, error) {
	n, err := native(ctx)
	if err != nil {
		return nil, err
	}
	tx, ok := n.(pgx.Tx)
	if !ok {
		return nil, fmt.Errorf("pgstore: the execution's transaction is a %T: the Store was made by NewDB, use SQLTx", n)
	}
	return tx, nil
}

// SQLTx is Tx for a Store made by NewDB: it returns the execution's
// *sql.Tx, the transaction to hand to GORM, sqlx, bun, ent or sqlc:
//
//	tx, err := pgstore.SQLTx(r.Context())
//
// It is the same transaction for every call in one execution. Outside
// such an execution it returns an error wrapping idem.ErrNoTx; for a Store
// made by New, an error (use Tx).
func SQLTx(ctx context.Context) (*sql.Tx, error) {
	n, err := native(ctx)
	if err != nil {
		return nil, err
	}
	tx, ok := n.(*sql.Tx)
	if !ok {
		return nil, fmt.Errorf("pgstore: the execution's transaction is a %T: the Store was made by New, use Tx", n)
	}
	return tx, nil
}

// native returns the execution's pgx.Tx or *sql.Tx.
func native(ctx context.Context) (any, error) {
	st, err := idem.TxFromContext(ctx)
	if err != nil {
		return nil, err
	}
	switch t := st.(type) {
	case *storeTx:
		return t.Native(), nil
	case *claimedTx:
		return t.Native(), nil
	}
	return nil, fmt.Errorf("pgstore: the execution's transaction is a %T, not a pgstore transaction", st)
}
