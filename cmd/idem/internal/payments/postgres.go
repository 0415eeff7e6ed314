package payments

import (
	"context"
	"errors"
	"fmt"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresRepo keeps payments in PostgreSQL.
type PostgresRepo struct {
	Pool *pgxpool.Pool
}

// Migrate implements Repo.
func (r PostgresRepo) Migrate(ctx context.Context) error {
	_, err := r.Pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS payments (
			id              TEXT        PRIMARY KEY,
			tenant          TEXT        NOT NULL,
			idempotency_key TEXT        NOT NULL,
			amount_cents    BIGINT      NOT NULL,
			currency        TEXT        NOT NULL,
			reference       TEXT        NOT NULL,
			created_at      TIMESTAMPTZ NOT NULL,
			UNIQUE (tenant, idempotency_key)
		)`)
	if err != nil {
		return fmt.Errorf("payments: migrate: %w", err)
	}
	return nil
}

// Insert implements Repo. Inside an execution on a pgstore it writes
// through the execution's transaction; otherwise in its own.
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
	tag, err := tx.Exec(ctx, `INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (tenant, idempotency_key) DO NOTHING`,
		p.ID, p.tenant, p.key, p.AmountCents, p.Currency, p.Reference, p.CreatedAt)
	if err != nil {
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
