package payments

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemhq/idem/sqlitestore"
)

// MigrateSteps implements StepRepo: the provider columns (NULL for
// payments made without a provider) and the derivation secret's table.
func (r SQLiteRepo) MigrateSteps(ctx context.Context) ([]byte, error) {
	tx, err := r.Store.DB().BeginTx(ctx, nil) // immediate: one migrating process at a time
	if err != nil {
		return nil, fmt.Errorf("payments: migrate steps: %w", err)
	}
	defer tx.Rollback()
	// Columns are added in groups (a file migrated by an earlier version
	// has the first group only), each group once.
	var stmts []string
	for _, g := range []struct {
		probe string
		add   []string
	}{
		{"status", []string{`status TEXT`, `charge_id TEXT`, `provider_key TEXT`}},
		{"failure_code", []string{`failure_code TEXT`, `failure_reason TEXT`}},
	} {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM pragma_table_info('payments') WHERE name = ?`, g.probe).Scan(&n); err != nil {
			return nil, fmt.Errorf("payments: migrate steps: %w", err)
		}
		for _, c := range g.add {
			if n == 0 {
				stmts = append(stmts, `ALTER TABLE payments ADD COLUMN `+c)
			}
		}
	}
	stmts = append(stmts, `CREATE TABLE IF NOT EXISTS payments_secret (id INTEGER PRIMARY KEY CHECK (id = 1), secret BLOB NOT NULL)`,
		`INSERT OR IGNORE INTO payments_secret (id, secret) VALUES (1, ?)`)
	fresh := make([]byte, 32)
	_, _ = rand.Read(fresh)
	for _, s := range stmts {
		var args []any
		if s == stmts[len(stmts)-1] {
			args = []any{fresh}
		}
		if _, err := tx.ExecContext(ctx, s, args...); err != nil {
			return nil, fmt.Errorf("payments: migrate steps: %w", err)
		}
	}
	if err := checkSQLiteTable(ctx, tx, slices.Concat(baseColumns, stepColumns), nil); err != nil {
		return nil, err
	}
	if err := r.migrateKeyIndex(ctx, tx); err != nil {
		return nil, err
	}
	var secret []byte
	if err := tx.QueryRowContext(ctx, `SELECT secret FROM payments_secret WHERE id = 1`).Scan(&secret); err != nil {
		return nil, fmt.Errorf("payments: migrate steps: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("payments: migrate steps: %w", err)
	}
	return secret, nil
}

// InsertPending implements StepRepo, through the execution's transaction.
func (r SQLiteRepo) InsertPending(ctx context.Context, p StepPayment) (StepPayment, error) {
	tx, err := sqlitestore.Tx(ctx)
	if err != nil {
		return p, fmt.Errorf("payments: insert: %w", err)
	}
	insert := `INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at, status, provider_key)
		VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?)`
	if !r.SameTx {
		insert += onConflictSQLite
	}
	res, err := tx.ExecContext(ctx, insert,
		p.ID, p.Tenant, p.Key, p.AmountCents, p.Currency, p.Reference, p.CreatedAt.Format(time.RFC3339Nano), p.ProviderKey)
	if err != nil {
		return p, fmt.Errorf("payments: insert: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 && !r.SameTx {
		got, err := scanStepSQLite(tx.QueryRowContext(ctx, selectStepSQLite+` WHERE tenant = ? AND idempotency_key = ?`, p.Tenant, p.Key))
		if err != nil {
			return p, fmt.Errorf("payments: insert: %w", err)
		}
		got.Tenant, got.Key = p.Tenant, p.Key
		return got, nil
	}
	return p, nil
}

// Capture implements StepRepo, through the execution's transaction.
func (r SQLiteRepo) Capture(ctx context.Context, id, chargeID string) error {
	tx, err := sqlitestore.Tx(ctx)
	if err != nil {
		return fmt.Errorf("payments: capture: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE payments SET status = 'captured', charge_id = ? WHERE id = ?`, chargeID, id); err != nil {
		return fmt.Errorf("payments: capture: %w", err)
	}
	return nil
}

// Fail implements StepRepo, through the execution's transaction.
func (r SQLiteRepo) Fail(ctx context.Context, id, code, reason string) error {
	tx, err := sqlitestore.Tx(ctx)
	if err != nil {
		return fmt.Errorf("payments: fail: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE payments SET status = 'failed', failure_code = ?, failure_reason = ? WHERE id = ?`, code, reason, id); err != nil {
		return fmt.Errorf("payments: fail: %w", err)
	}
	return nil
}

// GetStep implements StepRepo.
func (r SQLiteRepo) GetStep(ctx context.Context, tenant, id string) (StepPayment, error) {
	return scanStepSQLite(r.Store.ReadDB().QueryRowContext(ctx, selectStepSQLite+` WHERE tenant = ? AND id = ?`, tenant, id))
}

// Counts implements StepRepo.
func (r SQLiteRepo) Counts(ctx context.Context) (StepCounts, error) {
	var c StepCounts
	err := r.Store.ReadDB().QueryRowContext(ctx, `SELECT COUNT(*),
		COALESCE(SUM(CASE WHEN status = 'captured' THEN 1 ELSE 0 END), 0),
		COALESCE(SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END), 0) FROM payments`).Scan(&c.All, &c.Captured, &c.Failed)
	return c, err
}

var _ StepRepo = SQLiteRepo{}

const selectStepSQLite = `SELECT id, amount_cents, currency, reference, created_at,
	COALESCE(status, ''), COALESCE(charge_id, ''), COALESCE(provider_key, ''),
	COALESCE(failure_code, ''), COALESCE(failure_reason, '') FROM payments`

func scanStepSQLite(row *sql.Row) (StepPayment, error) {
	var p StepPayment
	var created string
	if err := row.Scan(&p.ID, &p.AmountCents, &p.Currency, &p.Reference, &created, &p.Status, &p.ChargeID, &p.ProviderKey,
		&p.FailureCode, &p.FailureReason); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return p, ErrNotFound
		}
		return p, err
	}
	t, err := time.Parse(time.RFC3339Nano, created)
	if err != nil {
		return p, err
	}
	p.CreatedAt = t
	return p, nil
}
