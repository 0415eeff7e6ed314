// Package pgdb runs the statements of pgstore and pgoutbox on either way a
// program reaches PostgreSQL: a pgx pool, or a database/sql DB opened with
// pgx's stdlib driver. The SQL is written once, against Querier; each side
// passes the arguments to pgx unchanged, so they encode alike.
package pgdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Row is one row of a query: pgx.Row and *sql.Row both are one. Scan
// reports no row with an error for which IsNoRows is true.
type Row interface {
	Scan(dest ...any) error
}

// Rows is the result of a query; Close may be called more than once.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close()
}

// Querier runs statements: a database or a transaction on it.
type Querier interface {
	// Exec runs sql and returns the number of rows it affected.
	Exec(ctx context.Context, sql string, args ...any) (int64, error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
	Query(ctx context.Context, sql string, args ...any) (Rows, error)
}

// DB is a database: statements run on a connection of its pool.
type DB interface {
	Querier
	// Begin begins a transaction with the server's default isolation.
	Begin(ctx context.Context) (Tx, error)
}

// Tx is a transaction of a DB.
type Tx interface {
	Querier
	// Commit commits; it returns within ctx.
	Commit(ctx context.Context) error
	// Rollback rolls back, within ctx; after Commit or an earlier
	// Rollback it does nothing and returns nil.
	Rollback(ctx context.Context) error
}

// IsNoRows reports whether err is the "no row" error of either side.
func IsNoRows(err error) bool {
	return errors.Is(err, pgx.ErrNoRows) || errors.Is(err, sql.ErrNoRows)
}

// BeginFunc runs f in a transaction of db, committing if f returns nil
// and rolling back otherwise.
func BeginFunc(ctx context.Context, db DB, f func(Tx) error) (err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			// The error that made us roll back is the one to report.
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err = f(tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Pool is a DB on a pgx pool.
type Pool struct{ P *pgxpool.Pool }

// Exec implements Querier.
func (p Pool) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := p.P.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

// QueryRow implements Querier.
func (p Pool) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return p.P.QueryRow(ctx, sql, args...)
}

// Query implements Querier.
func (p Pool) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	rows, err := p.P.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

// Begin implements DB.
func (p Pool) Begin(ctx context.Context) (Tx, error) {
	tx, err := p.P.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return PgxTx{T: tx}, nil
}

// PgxTx is a Tx on a pgx.Tx.
type PgxTx struct{ T pgx.Tx }

// Exec implements Querier.
func (t PgxTx) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := t.T.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

// QueryRow implements Querier.
func (t PgxTx) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return t.T.QueryRow(ctx, sql, args...)
}

// Query implements Querier.
func (t PgxTx) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	rows, err := t.T.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return rows, nil
}

// Commit implements Tx.
func (t PgxTx) Commit(ctx context.Context) error { return t.T.Commit(ctx) }

// Rollback implements Tx.
func (t PgxTx) Rollback(ctx context.Context) error {
	if err := t.T.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	return nil
}

// SQL is a DB on a database/sql DB opened with pgx's stdlib driver.
type SQL struct{ D *sql.DB }

// Exec implements Querier.
func (d SQL) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	return rowsAffected(d.D.ExecContext(ctx, sql, args...))
}

// QueryRow implements Querier.
func (d SQL) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return d.D.QueryRowContext(ctx, sql, args...)
}

// Query implements Querier.
func (d SQL) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	rows, err := d.D.QueryContext(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

// Begin implements DB. The transaction's context is ctx with a cancel of
// its own, which Commit and Rollback use to bound their wait (see SQLTx).
func (d SQL) Begin(ctx context.Context) (Tx, error) {
	txCtx, cancel := context.WithCancelCause(ctx)
	tx, err := d.D.BeginTx(txCtx, nil)
	if err != nil {
		cancel(nil)
		return nil, err
	}
	return &SQLTx{T: tx, cancel: cancel}, nil
}

func rowsAffected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// sqlRows adapts *sql.Rows, whose Close returns an error that Err also
// reports.
type sqlRows struct{ *sql.Rows }

func (r sqlRows) Close() { _ = r.Rows.Close() }

// SQLTx is a Tx on a *sql.Tx.
//
// database/sql's Commit and Rollback take no context: pgx's stdlib driver
// runs them with the context the transaction began with. So that they
// return within their own ctx, as on pgx, that context is cancelled when
// ctx ends first; database/sql then discards the connection.
type SQLTx struct {
	T      *sql.Tx
	cancel context.CancelCauseFunc
}

// Exec implements Querier.
func (t *SQLTx) Exec(ctx context.Context, sql string, args ...any) (int64, error) {
	return rowsAffected(t.T.ExecContext(ctx, sql, args...))
}

// QueryRow implements Querier.
func (t *SQLTx) QueryRow(ctx context.Context, sql string, args ...any) Row {
	return t.T.QueryRowContext(ctx, sql, args...)
}

// Query implements Querier.
func (t *SQLTx) Query(ctx context.Context, sql string, args ...any) (Rows, error) {
	rows, err := t.T.QueryContext(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return sqlRows{rows}, nil
}

// Commit implements Tx.
func (t *SQLTx) Commit(ctx context.Context) error {
	return t.end(ctx, t.T.Commit)
}

// Rollback implements Tx.
func (t *SQLTx) Rollback(ctx context.Context) error {
	if err := t.end(ctx, t.T.Rollback); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

// end runs Commit or Rollback, bounded by ctx.
func (t *SQLTx) end(ctx context.Context, f func() error) error {
	stop := context.AfterFunc(ctx, func() { t.cancel(context.Cause(ctx)) })
	err := f()
	stop()
	if err != nil && ctx.Err() != nil && !errors.Is(err, sql.ErrTxDone) {
		err = fmt.Errorf("%w: %w", context.Cause(ctx), err)
	}
	t.cancel(nil) // the transaction is over: release its context
	return err
}
