package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// commit commits tx within ctx. database/sql's Tx.Commit takes no context,
// and a server that stops answering would hold it until the driver's
// readTimeout: COMMIT is sent as a statement bound to ctx first (the
// driver closes the connection when ctx ends), and Tx.Commit then only
// releases the connection.
func commit(ctx context.Context, tx *sql.Tx) error {
	if _, err := tx.ExecContext(ctx, "COMMIT"); err != nil {
		_ = rollback(ctx, tx)
		return err
	}
	return tx.Commit()
}

// rollbackWait bounds a rollback, which runs even when the caller's
// context has ended.
const rollbackWait = 5 * time.Second

// rollback is commit's counterpart: ROLLBACK bound to a deadline, then
// Tx.Rollback. It does nothing on a transaction that has ended.
func rollback(ctx context.Context, tx *sql.Tx) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackWait)
	defer cancel()
	_, err := tx.ExecContext(rctx, "ROLLBACK")
	if errors.Is(err, sql.ErrTxDone) {
		return nil
	}
	if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) && err == nil {
		err = rerr
	}
	return err
}

// CompleteTx is Complete inside the caller's transaction tx, which must be
// on the Store's database: the business writes made in tx, the owner-token
// check and the stored response commit together, or not at all. It returns
// idemstore.ErrLeaseLost if p.Token no longer owns an in-flight record; the
// caller must then roll tx back, so that no business write survives a lost
// lease. It returns idemstore.ErrResponseTooLarge, executing nothing in tx,
// as Complete does.
//
// Call it last, just before Commit: from this statement on, tx holds the
// record's row lock, and claims that meet it back off (Config.LockWait).
// It works under any isolation level: InnoDB's UPDATE reads the latest
// committed row, whatever the transaction's snapshot.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, p idemstore.CompleteParams) error {
	if tx == nil {
		return errors.New("mysqlstore: complete in transaction: nil transaction")
	}
	return s.complete(ctx, tx, p, "complete in transaction")
}

// SaveCheckpointTx is SaveCheckpoint inside the caller's transaction tx on
// the Store's database: a step's business writes and its recovery point
// commit together. It returns idemstore.ErrLeaseLost when the token no
// longer owns the record; the caller must then roll back. As with
// CompleteTx, call it last, just before Commit.
func (s *Store) SaveCheckpointTx(ctx context.Context, tx *sql.Tx, p idemstore.SaveCheckpointParams) error {
	if tx == nil {
		return errors.New("mysqlstore: save checkpoint in transaction: nil transaction")
	}
	return s.saveCheckpoint(ctx, tx, p)
}

// BeginTx implements idemstore.TxStore: it begins a transaction on the
// Store's *sql.DB with the server's default isolation level (REPEATABLE
// READ unless the server or the DSN says otherwise). The core calls it
// lazily, when the operation first asks for its transaction (see Tx).
func (s *Store) BeginTx(ctx context.Context) (idemstore.Tx, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: begin: %w", err)
	}
	return &storeTx{s: s, tx: tx}, nil
}

// storeTx is the idemstore.Tx of a Store, begun by BeginTx or ClaimTx.
//
// It does not implement idemstore.TxRenewer: renewals go through the
// *sql.DB, on other connections. InnoDB's row locks and MVCC let them
// update the record while the business transaction is open, because that
// transaction does not touch the record until CompleteTx, its last
// statement. (A transaction from ClaimTx holds an uncommitted record that
// needs no renewal: nobody else can see it.)
type storeTx struct {
	s  *Store
	tx *sql.Tx
}

var (
	_ idemstore.Tx           = (*storeTx)(nil)
	_ idemstore.CheckpointTx = (*storeTx)(nil)
)

func (t *storeTx) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	return t.s.CompleteTx(ctx, t.tx, p)
}

// SaveCheckpoint implements idemstore.CheckpointTx.
func (t *storeTx) SaveCheckpoint(ctx context.Context, p idemstore.SaveCheckpointParams) error {
	return t.s.SaveCheckpointTx(ctx, t.tx, p)
}

func (t *storeTx) Commit(ctx context.Context) error {
	if err := commit(ctx, t.tx); err != nil {
		return fmt.Errorf("mysqlstore: commit: %w", err)
	}
	return nil
}

// Rollback does nothing after Commit or an earlier Rollback, as
// idemstore.Tx requires.
func (t *storeTx) Rollback(ctx context.Context) error {
	if err := rollback(ctx, t.tx); err != nil {
		return fmt.Errorf("mysqlstore: rollback: %w", err)
	}
	return nil
}

// Native returns the *sql.Tx.
func (t *storeTx) Native() any { return t.tx }

// Tx returns the transaction of the idempotent execution ctx belongs to (a
// handler's request context under idem.Middleware, or an operation's
// context in idem.Executor.Do), beginning it on first use. Business writes
// made through it commit together with the stored response after the
// handler returns and before the response is sent, and roll back if the
// handler fails (a released outcome such as a 5xx), panics or loses its
// lease. Do not commit or roll it back yourself.
//
// Outside an execution on a mysqlstore.Store it returns an error wrapping
// idem.ErrNoTx.
func Tx(ctx context.Context) (*sql.Tx, error) {
	st, err := idem.TxFromContext(ctx)
	if err != nil {
		return nil, err
	}
	t, ok := st.(*storeTx)
	if !ok {
		return nil, fmt.Errorf("mysqlstore: the execution's store is not a mysqlstore: %w", idem.ErrNoTx)
	}
	return t.tx, nil
}
