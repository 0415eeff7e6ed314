package payments

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"

	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5"
)

// MigrateSteps implements StepRepo: the provider columns (NULL for
// payments made without a provider) and the derivation secret's table.
// It holds the migration lock (see migrateLocked), so that instances
// starting together do not race, and checks the columns' types as Migrate
// does.
func (r PostgresRepo) MigrateSteps(ctx context.Context) ([]byte, error) {
	fresh := make([]byte, 32)
	_, _ = rand.Read(fresh)
	var secret []byte
	err := r.migrateLocked(ctx, "migrate steps", func(ctx context.Context, tx pgx.Tx) error {
		for _, s := range []string{
			`ALTER TABLE payments ADD COLUMN IF NOT EXISTS status TEXT`,
			`ALTER TABLE payments ADD COLUMN IF NOT EXISTS charge_id TEXT`,
			`ALTER TABLE payments ADD COLUMN IF NOT EXISTS provider_key TEXT`,
			`ALTER TABLE payments ADD COLUMN IF NOT EXISTS failure_code TEXT`,
			`ALTER TABLE payments ADD COLUMN IF NOT EXISTS failure_reason TEXT`,
			`CREATE TABLE IF NOT EXISTS payments_secret (id INTEGER PRIMARY KEY CHECK (id = 1), secret BYTEA NOT NULL)`,
		} {
			if _, err := tx.Exec(ctx, s); err != nil {
				return err
			}
		}
		t, err := pgPaymentsTable(ctx, tx)
		if err != nil {
			return err
		}
		if err := t.check(ctx, tx, slices.Concat(baseColumns, stepColumns), nil); err != nil {
			return err
		}
		if err := t.migrateKeyIndex(ctx, tx, r.SameTx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO payments_secret (id, secret) VALUES (1, $1) ON CONFLICT (id) DO NOTHING`, fresh); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT secret FROM payments_secret WHERE id = 1`).Scan(&secret)
	})
	if err != nil {
		return nil, err
	}
	return secret, nil
}

// InsertPending implements StepRepo, through the execution's transaction.
func (r PostgresRepo) InsertPending(ctx context.Context, p StepPayment) (StepPayment, error) {
	tx, err := pgstore.Tx(ctx)
	if err != nil {
		return p, fmt.Errorf("payments: insert: %w", err)
	}
	insert := `INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at, status, provider_key)
		VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8)`
	if !r.SameTx {
		insert += onConflictPostgres
	}
	tag, err := tx.Exec(ctx, insert,
		p.ID, p.Tenant, p.Key, p.AmountCents, p.Currency, p.Reference, p.CreatedAt, p.ProviderKey)
	if err != nil {
		return p, fmt.Errorf("payments: insert: %w", err)
	}
	if tag.RowsAffected() == 0 && !r.SameTx {
		got, err := scanStepPostgres(tx.QueryRow(ctx, selectStepPostgres+` WHERE tenant = $1 AND idempotency_key = $2`, p.Tenant, p.Key))
		if err != nil {
			return p, fmt.Errorf("payments: insert: %w", err)
		}
		got.Tenant, got.Key = p.Tenant, p.Key
		return got, nil
	}
	return p, nil
}

// Capture implements StepRepo, through the execution's transaction.
func (r PostgresRepo) Capture(ctx context.Context, id, chargeID string) error {
	tx, err := pgstore.Tx(ctx)
	if err != nil {
		return fmt.Errorf("payments: capture: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE payments SET status = 'captured', charge_id = $1 WHERE id = $2`, chargeID, id); err != nil {
		return fmt.Errorf("payments: capture: %w", err)
	}
	return nil
}

// Fail implements StepRepo, through the execution's transaction.
func (r PostgresRepo) Fail(ctx context.Context, id, code, reason string) error {
	tx, err := pgstore.Tx(ctx)
	if err != nil {
		return fmt.Errorf("payments: fail: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE payments SET status = 'failed', failure_code = $1, failure_reason = $2 WHERE id = $3`, code, reason, id); err != nil {
		return fmt.Errorf("payments: fail: %w", err)
	}
	return nil
}

// GetStep implements StepRepo.
func (r PostgresRepo) GetStep(ctx context.Context, tenant, id string) (StepPayment, error) {
	return scanStepPostgres(r.Pool.QueryRow(ctx, selectStepPostgres+` WHERE tenant = $1 AND id = $2`, tenant, id))
}

// Counts implements StepRepo.
func (r PostgresRepo) Counts(ctx context.Context) (StepCounts, error) {
	var c StepCounts
	err := r.Pool.QueryRow(ctx, `SELECT COUNT(*), COUNT(*) FILTER (WHERE status = 'captured'),
		COUNT(*) FILTER (WHERE status = 'failed') FROM payments`).Scan(&c.All, &c.Captured, &c.Failed)
	return c, err
}

var _ StepRepo = PostgresRepo{}

const selectStepPostgres = `SELECT id, amount_cents, currency, reference, created_at,
	COALESCE(status, ''), COALESCE(charge_id, ''), COALESCE(provider_key, ''),
	COALESCE(failure_code, ''), COALESCE(failure_reason, '') FROM payments`

func scanStepPostgres(row pgx.Row) (StepPayment, error) {
	var p StepPayment
	if err := row.Scan(&p.ID, &p.AmountCents, &p.Currency, &p.Reference, &p.CreatedAt, &p.Status, &p.ChargeID, &p.ProviderKey,
		&p.FailureCode, &p.FailureReason); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return p, ErrNotFound
		}
		return p, err
	}
	p.CreatedAt = p.CreatedAt.UTC()
	return p, nil
}
