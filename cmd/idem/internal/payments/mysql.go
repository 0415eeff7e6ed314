package payments

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"slices"

	"github.com/go-sql-driver/mysql"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/mysqlstore"
)

// MySQLRepo keeps payments in MariaDB, in the database of a mysqlstore's
// *sql.DB. The pool must scan DATETIME columns as time.Time in UTC
// (parseTime=true&loc=UTC), as the backend's pools do.
type MySQLRepo struct {
	DB *sql.DB
	// SameTx says that the idempotency records are in this database and
	// commit in the payment's transaction: see SQLiteRepo.SameTx.
	SameTx bool
}

// createMySQL is the payments table on MariaDB. Text columns that are
// compared are VARCHAR in a binary collation: tenants and keys differ by
// case, and the unique index needs a bounded length.
const createMySQL = `CREATE TABLE IF NOT EXISTS payments (
	id              VARCHAR(64)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
	tenant          VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
	idempotency_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
	amount_cents    BIGINT       NOT NULL,
	currency        VARCHAR(16)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
	reference       TEXT         CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
	created_at      DATETIME(6)  NOT NULL
) ENGINE = InnoDB`

// migrateLockedMySQL runs fn on one connection holding a named lock
// (GET_LOCK): MariaDB commits DDL statement by statement, so instances
// that start together on a fresh database migrate one after the other
// under the lock instead of in a transaction.
func (r MySQLRepo) migrateLockedMySQL(ctx context.Context, what string, fn func(context.Context, *sql.Conn) error) error {
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	err := func() error {
		conn, err := r.DB.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		const lock = "CONCAT('idem_payments:', SHA1(COALESCE(DATABASE(), '')))"
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+lock+", ?)", int(migrateTimeout.Seconds())).Scan(&got); err != nil {
			return fmt.Errorf("take the migration lock: %w", err)
		}
		if got.Int64 != 1 {
			return errors.New("another instance held the migration lock")
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK("+lock+")")
		return fn(ctx, conn)
	}()
	var se *SchemaError
	switch {
	case errors.As(err, &se):
		return err
	case err != nil:
		return fmt.Errorf("payments: %s: %w", what, err)
	}
	return nil
}

// Migrate implements Repo: it creates the payments table unless it
// exists, and checks that an existing one is the demo's.
func (r MySQLRepo) Migrate(ctx context.Context) error {
	return r.migrateLockedMySQL(ctx, "migrate", func(ctx context.Context, conn *sql.Conn) error {
		if _, err := conn.ExecContext(ctx, createMySQL); err != nil {
			return err
		}
		if err := checkMySQLTable(ctx, conn, baseColumns, stepColumns); err != nil {
			return err
		}
		return r.migrateKeyIndex(ctx, conn)
	})
}

// migrateKeyIndex gives the table the unique index on (tenant,
// idempotency_key) unless the records share the payment's transaction,
// and drops it if they do: see keyIndexName.
func (r MySQLRepo) migrateKeyIndex(ctx context.Context, conn *sql.Conn) error {
	var unique, ours int
	if err := conn.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(INDEX_NAME = ?), 0) FROM (SELECT INDEX_NAME FROM information_schema.STATISTICS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'payments' AND NON_UNIQUE = 0
		GROUP BY INDEX_NAME HAVING GROUP_CONCAT(COLUMN_NAME ORDER BY SEQ_IN_INDEX) = 'tenant,idempotency_key') u`, keyIndexName).Scan(&unique, &ours); err != nil {
		return fmt.Errorf("look up the unique index on (tenant, idempotency_key): %w", err)
	}
	switch {
	case !r.SameTx && unique == 0:
		_, err := conn.ExecContext(ctx, `ALTER TABLE payments ADD UNIQUE KEY `+keyIndexName+` (tenant, idempotency_key)`)
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == 1062 { // ER_DUP_ENTRY
			return errors.New("payments: migrate: " + errDuplicateKeys + "; keep the records in this database (no --store), or give --db another database")
		}
		return err
	case r.SameTx && ours > 0:
		_, err := conn.ExecContext(ctx, `ALTER TABLE payments DROP INDEX `+keyIndexName)
		return err
	}
	return nil
}

// checkMySQLTable returns a *SchemaError unless the payments table has
// the demo's columns.
func checkMySQLTable(ctx context.Context, conn *sql.Conn, want, optional []column) error {
	fail := func(problems []string) error {
		return &SchemaError{Table: "payments", Problems: problems,
			Fix: "give --db another database for the demo (CREATE DATABASE idem_demo; --db mysql://…/idem_demo), " +
				"or rename that table (RENAME TABLE payments TO …) if it is yours to change"}
	}
	rows, err := conn.QueryContext(ctx, `SELECT COLUMN_NAME, DATA_TYPE, IS_NULLABLE = 'NO' AND COLUMN_DEFAULT IS NULL AND EXTRA = ''
		FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'payments' ORDER BY ORDINAL_POSITION`)
	if err != nil {
		return fmt.Errorf("check the payments table: %w", err)
	}
	var got []tableColumn
	for rows.Next() {
		var c tableColumn
		if err := rows.Scan(&c.name, &c.typ, &c.required); err != nil {
			rows.Close()
			return fmt.Errorf("check the payments table: %w", err)
		}
		got = append(got, c)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("check the payments table: %w", err)
	}
	// The primary key id is NOT NULL without a default, and the inserts
	// set it.
	if problems := shapeProblems(got, want, optional, func(c column) string { return c.mysql }); len(problems) > 0 {
		return fail(problems)
	}
	return nil
}

const insertMySQL = `INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at)
	VALUES (?, ?, ?, ?, ?, ?, ?)`

// onDuplicateMySQL makes an insert leave the payment already stored for
// the tenant and key in place (records kept elsewhere).
const onDuplicateMySQL = ` ON DUPLICATE KEY UPDATE id = id`

func (r MySQLRepo) insertSQL(insert string) string {
	if r.SameTx {
		return insert
	}
	return insert + onDuplicateMySQL
}

// Insert implements Repo. Inside an execution on a mysqlstore it writes
// through the execution's transaction; otherwise in its own. A row MariaDB
// refuses as invalid is a *RejectedError; MariaDB undoes only the refused
// statement, so the execution's transaction stays usable and the answer is
// stored with it.
func (r MySQLRepo) Insert(ctx context.Context, p Payment) (Payment, error) {
	tx, err := mysqlstore.Tx(ctx)
	own := false
	if errors.Is(err, idem.ErrNoTx) {
		if tx, err = r.DB.BeginTx(ctx, nil); err != nil {
			return Payment{}, fmt.Errorf("payments: insert: %w", err)
		}
		own = true
		defer tx.Rollback()
	} else if err != nil {
		return Payment{}, fmt.Errorf("payments: insert: %w", err)
	}
	res, err := tx.ExecContext(ctx, r.insertSQL(insertMySQL), p.ID, p.tenant, p.key, p.AmountCents, p.Currency, p.Reference, p.CreatedAt.UTC())
	if err != nil {
		if re := rejectedMySQL(err); re != nil {
			return Payment{}, re
		}
		return Payment{}, fmt.Errorf("payments: insert: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 && !r.SameTx {
		// The same tenant and key already paid: a re-execution after a
		// crash. Return that payment.
		if p, err = scanMySQL(tx.QueryRowContext(ctx, selectMySQL+` WHERE tenant = ? AND idempotency_key = ?`, p.tenant, p.key)); err != nil {
			return Payment{}, fmt.Errorf("payments: insert: %w", err)
		}
	}
	if own {
		if err := tx.Commit(); err != nil {
			return Payment{}, fmt.Errorf("payments: insert: %w", err)
		}
	}
	return p, nil
}

// rejectedMySQL returns a *RejectedError when err is MariaDB refusing the
// row's data, nil otherwise.
func rejectedMySQL(err error) *RejectedError {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return nil
	}
	switch me.Number {
	case 1048, 1264, 1265, 1366, 1406, 1292, 3819, 4025:
		// column cannot be null, out of range, truncated, incorrect
		// value, data too long, incorrect datetime, CHECK violated.
		return &RejectedError{Reason: fmt.Sprintf("the database refused the payment (MariaDB error %d)", me.Number), Err: err}
	}
	return nil
}

const selectMySQL = `SELECT id, amount_cents, currency, reference, created_at FROM payments`

func scanMySQL(row *sql.Row) (Payment, error) {
	var p Payment
	if err := row.Scan(&p.ID, &p.AmountCents, &p.Currency, &p.Reference, &p.CreatedAt); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return p, ErrNotFound
		}
		return p, err
	}
	p.CreatedAt = p.CreatedAt.UTC()
	return p, nil
}

// Get implements Repo.
func (r MySQLRepo) Get(ctx context.Context, tenant, id string) (Payment, error) {
	return scanMySQL(r.DB.QueryRowContext(ctx, selectMySQL+` WHERE tenant = ? AND id = ?`, tenant, id))
}

// Count implements Repo.
func (r MySQLRepo) Count(ctx context.Context) (int64, error) {
	var n int64
	err := r.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM payments`).Scan(&n)
	return n, err
}

// MigrateSteps implements StepRepo: the provider columns and the
// derivation secret's table, under the migration lock.
func (r MySQLRepo) MigrateSteps(ctx context.Context) ([]byte, error) {
	fresh := make([]byte, 32)
	_, _ = rand.Read(fresh)
	var secret []byte
	err := r.migrateLockedMySQL(ctx, "migrate steps", func(ctx context.Context, conn *sql.Conn) error {
		for _, s := range []string{
			`ALTER TABLE payments ADD COLUMN IF NOT EXISTS status VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL`,
			`ALTER TABLE payments ADD COLUMN IF NOT EXISTS charge_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL`,
			`ALTER TABLE payments ADD COLUMN IF NOT EXISTS provider_key VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL`,
			`ALTER TABLE payments ADD COLUMN IF NOT EXISTS failure_code VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL`,
			`ALTER TABLE payments ADD COLUMN IF NOT EXISTS failure_reason TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL`,
			`CREATE TABLE IF NOT EXISTS payments_secret (id INT NOT NULL PRIMARY KEY, secret VARBINARY(64) NOT NULL) ENGINE = InnoDB`,
		} {
			if _, err := conn.ExecContext(ctx, s); err != nil {
				return err
			}
		}
		if err := checkMySQLTable(ctx, conn, slices.Concat(baseColumns, stepColumns), nil); err != nil {
			return err
		}
		if err := r.migrateKeyIndex(ctx, conn); err != nil {
			return err
		}
		if _, err := conn.ExecContext(ctx, `INSERT INTO payments_secret (id, secret) VALUES (1, ?) ON DUPLICATE KEY UPDATE id = id`, fresh); err != nil {
			return err
		}
		return conn.QueryRowContext(ctx, `SELECT secret FROM payments_secret WHERE id = 1`).Scan(&secret)
	})
	if err != nil {
		return nil, err
	}
	return secret, nil
}

// InsertPending implements StepRepo, through the execution's transaction.
func (r MySQLRepo) InsertPending(ctx context.Context, p StepPayment) (StepPayment, error) {
	tx, err := mysqlstore.Tx(ctx)
	if err != nil {
		return p, fmt.Errorf("payments: insert: %w", err)
	}
	res, err := tx.ExecContext(ctx, r.insertSQL(`INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at, status, provider_key)
		VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?)`),
		p.ID, p.Tenant, p.Key, p.AmountCents, p.Currency, p.Reference, p.CreatedAt.UTC(), p.ProviderKey)
	if err != nil {
		return p, fmt.Errorf("payments: insert: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 && !r.SameTx {
		got, err := scanStepMySQL(tx.QueryRowContext(ctx, selectStepMySQL+` WHERE tenant = ? AND idempotency_key = ?`, p.Tenant, p.Key))
		if err != nil {
			return p, fmt.Errorf("payments: insert: %w", err)
		}
		got.Tenant, got.Key = p.Tenant, p.Key
		return got, nil
	}
	return p, nil
}

// Capture implements StepRepo, through the execution's transaction.
func (r MySQLRepo) Capture(ctx context.Context, id, chargeID string) error {
	tx, err := mysqlstore.Tx(ctx)
	if err != nil {
		return fmt.Errorf("payments: capture: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE payments SET status = 'captured', charge_id = ? WHERE id = ?`, chargeID, id); err != nil {
		return fmt.Errorf("payments: capture: %w", err)
	}
	return nil
}

// Fail implements StepRepo, through the execution's transaction.
func (r MySQLRepo) Fail(ctx context.Context, id, code, reason string) error {
	tx, err := mysqlstore.Tx(ctx)
	if err != nil {
		return fmt.Errorf("payments: fail: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE payments SET status = 'failed', failure_code = ?, failure_reason = ? WHERE id = ?`, code, reason, id); err != nil {
		return fmt.Errorf("payments: fail: %w", err)
	}
	return nil
}

// GetStep implements StepRepo.
func (r MySQLRepo) GetStep(ctx context.Context, tenant, id string) (StepPayment, error) {
	return scanStepMySQL(r.DB.QueryRowContext(ctx, selectStepMySQL+` WHERE tenant = ? AND id = ?`, tenant, id))
}

// Counts implements StepRepo.
func (r MySQLRepo) Counts(ctx context.Context) (StepCounts, error) {
	var c StepCounts
	err := r.DB.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(status = 'captured'), 0),
		COALESCE(SUM(status = 'failed'), 0) FROM payments`).Scan(&c.All, &c.Captured, &c.Failed)
	return c, err
}

var (
	_ Repo     = MySQLRepo{}
	_ StepRepo = MySQLRepo{}
)

const selectStepMySQL = `SELECT id, amount_cents, currency, reference, created_at,
	COALESCE(status, ''), COALESCE(charge_id, ''), COALESCE(provider_key, ''),
	COALESCE(failure_code, ''), COALESCE(failure_reason, '') FROM payments`

func scanStepMySQL(row *sql.Row) (StepPayment, error) {
	var p StepPayment
	if err := row.Scan(&p.ID, &p.AmountCents, &p.Currency, &p.Reference, &p.CreatedAt, &p.Status, &p.ChargeID, &p.ProviderKey,
		&p.FailureCode, &p.FailureReason); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return p, ErrNotFound
		}
		return p, err
	}
	p.CreatedAt = p.CreatedAt.UTC()
	return p, nil
}
