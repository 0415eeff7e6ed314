package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresRepo keeps payments in PostgreSQL.
type PostgresRepo struct {
	Pool *pgxpool.Pool
}

// Migrate implements Repo.
func (r PostgresRepo) Migrate(ctx context.Context) error {
	_, err := r.Pool.Exec(ctx, createTable("BIGINT", "TIMESTAMPTZ"))
	if err != nil {
		return fmt.Errorf("payments: migrate: %w", err)
	}
	return nil
}

// Insert implements Repo. Inside an execution on a pgstore it writes
// through the execution's transaction; otherwise in its own. A row the
// database refuses as invalid (SQLSTATE class 22, data exception, or 23,
// integrity constraint violation) is a *RejectedError; inside the
// execution's transaction the insert runs under a savepoint, so that the
// transaction survives the refusal and the answer is stored with it.
func (r PostgresRepo) Insert(ctx context.Context, p Payment) (Payment, error) {
	tx, err := pgstore.Tx(ctx)
	own := false
	if errors.Is(err, idem.ErrNoTx) {
		if tx, err = r.Pool.Begin(ctx); err != nil {
			return Payment{}, fmt.Errorf("payments: insert: %w", err)
		}
		own = true
		defer tx.Rollback(context.WithoutCancel(ctx))
	} else if err != nil {
		return Payment{}, fmt.Errorf("payments: insert: %w", err)
	}
	const insert = `INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (tenant, idempotency_key) DO NOTHING`
	args := []any{p.ID, p.tenant, p.key, p.AmountCents, p.Currency, p.Reference, p.CreatedAt}
	var tag pgconn.CommandTag
	if own {
		tag, err = tx.Exec(ctx, insert, args...)
	} else {
		// One round trip: the savepoint, the insert and its release are
		// pipelined; only a refusal costs a second (the rollback to the
		// savepoint).
		b := &pgx.Batch{}
		b.Queue(`SAVEPOINT payment_insert`)
		b.Queue(insert, args...)
		b.Queue(`RELEASE SAVEPOINT payment_insert`)
		br := tx.SendBatch(ctx, b)
		_, err = br.Exec()
		if err == nil {
			tag, err = br.Exec()
		}
		if err == nil {
			_, err = br.Exec()
		}
		err = errors.Join(err, br.Close())
		if err != nil && rejected(err) != nil {
			if _, rerr := tx.Exec(ctx, `ROLLBACK TO SAVEPOINT payment_insert`); rerr != nil {
				return Payment{}, fmt.Errorf("payments: insert: %w", errors.Join(err, rerr))
			}
		}
	}
	if err != nil {
		if re := rejected(err); re != nil {
			return Payment{}, re
		}
		return Payment{}, fmt.Errorf("payments: insert: %w", err)
	}
	if tag.RowsAffected() == 0 {
		if p, err = scanPostgres(tx.QueryRow(ctx, selectPostgres+` WHERE tenant = $1 AND idempotency_key = $2`, p.tenant, p.key)); err != nil {
			return Payment{}, fmt.Errorf("payments: insert: %w", err)
		}
	}
	if own {
		if err := tx.Commit(ctx); err != nil {
			return Payment{}, fmt.Errorf("payments: insert: %w", err)
		}
	}
	return p, nil
}

// rejected returns a *RejectedError when err is PostgreSQL refusing the
// data (SQLSTATE class 22 or 23), nil otherwise. A unique violation
// (23505) is not a refusal: the only unique columns besides (tenant, key),
// which the insert handles, are the random id, and a collision is worth a
// retry.
func rejected(err error) *RejectedError {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code == "23505" {
		return nil
	}
	if class := pe.Code[:min(2, len(pe.Code))]; class == "22" || class == "23" {
		reason := "the database refused a value (SQLSTATE " + pe.Code + ")"
		if pe.ConstraintName != "" {
			reason = "the payment violates the database constraint " + pe.ConstraintName + " (SQLSTATE " + pe.Code + ")"
		}
		return &RejectedError{Reason: reason, Err: err}
	}
	return nil
}

const selectPostgres = `SELECT id, amount_cents, currency, reference, created_at FROM payments`

func scanPostgres(row pgx.Row) (Payment, error) {
	var p Payment
	if err := row.Scan(&p.ID, &p.AmountCents, &p.Currency, &p.Reference, &p.CreatedAt); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return p, ErrNotFound
		}
		return p, err
	}
	p.CreatedAt = p.CreatedAt.UTC()
	return p, nil
}

// Get implements Repo.
func (r PostgresRepo) Get(ctx context.Context, tenant, id string) (Payment, error) {
	return scanPostgres(r.Pool.QueryRow(ctx, selectPostgres+` WHERE tenant = $1 AND id = $2`, tenant, id))
}

// Count implements Repo.
func (r PostgresRepo) Count(ctx context.Context) (int64, error) {
	var n int64
	err := r.Pool.QueryRow(ctx, `SELECT COUNT(*) FROM payments`).Scan(&n)
	return n, err
}
