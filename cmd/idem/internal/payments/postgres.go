package payments

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresRepo keeps payments in PostgreSQL.
type PostgresRepo struct {
	Pool *pgxpool.Pool
	// SameTx says that the idempotency records are in this database and
	// commit in the payment's transaction: see SQLiteRepo.SameTx.
	SameTx bool
}

// Migrate implements Repo: it creates the payments table (in the first
// schema of the connection's search_path, usually public) unless it
// exists, and checks that an existing one is the demo's: a table of
// another shape is a *SchemaError. It holds the migration lock (see
// migrateLocked), so that instances starting together on a fresh database
// do not race.
func (r PostgresRepo) Migrate(ctx context.Context) error {
	return r.migrateLocked(ctx, "migrate", func(ctx context.Context, tx pgx.Tx) error {
		t, err := pgPaymentsTable(ctx, tx)
		if err == nil && t == nil {
			if _, err = tx.Exec(ctx, createTable("BIGINT", "TIMESTAMPTZ")); err == nil {
				t, err = pgPaymentsTable(ctx, tx)
			}
		}
		if err != nil {
			return err
		}
		if err := t.check(ctx, tx, baseColumns, stepColumns); err != nil {
			return err
		}
		return t.migrateKeyIndex(ctx, tx, r.SameTx)
	})
}

// migrateKeyIndex gives the table the unique index on (tenant,
// idempotency_key) unless the records share the payment's transaction,
// and drops it (or the table constraint that tables created before held)
// if they do: see keyIndexName.
func (t *pgTable) migrateKeyIndex(ctx context.Context, tx pgx.Tx, sameTx bool) error {
	rows, err := tx.Query(ctx, `SELECT i.indexrelid::regclass::text, COALESCE(c.conname::text, '')
		FROM pg_catalog.pg_index i
		LEFT JOIN pg_catalog.pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid AND c.contype = 'u'
		WHERE i.indrelid = $1 AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
			AND (SELECT array_agg(a.attname::text ORDER BY k.ord) FROM unnest(i.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
				JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum) = ARRAY['tenant', 'idempotency_key']`, t.oid)
	if err != nil {
		return fmt.Errorf("look up the unique index on (tenant, idempotency_key): %w", err)
	}
	type index struct{ name, constraint string }
	found, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (index, error) {
		var i index
		err := row.Scan(&i.name, &i.constraint)
		return i, err
	})
	if err != nil {
		return fmt.Errorf("look up the unique index on (tenant, idempotency_key): %w", err)
	}
	if !sameTx {
		if len(found) > 0 {
			return nil
		}
		_, err := tx.Exec(ctx, `CREATE UNIQUE INDEX `+keyIndexName+` ON `+t.name+` (tenant, idempotency_key)`)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "23505" {
			return errors.New("payments: migrate: " + errDuplicateKeys + "; keep the records in this database (no --store), or give --db another database")
		}
		return err
	}
	for _, i := range found {
		var q string
		switch {
		case i.constraint != "":
			q = `ALTER TABLE ` + t.name + ` DROP CONSTRAINT ` + pgx.Identifier{i.constraint}.Sanitize()
		case strings.HasSuffix(i.name, keyIndexName):
			q = `DROP INDEX ` + i.name
		default:
			continue // somebody else's index: left alone
		}
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("drop the unique index on (tenant, idempotency_key): %w", err)
		}
	}
	return nil
}

// migrateTimeout bounds a migration, the wait for another instance's
// included.
const migrateTimeout = 30 * time.Second

// migrateLocked runs fn in a transaction that holds a transaction-scoped
// advisory lock, as pgstore's migrations do: instances that start together
// on a fresh database migrate one after the other. Without it, two
// concurrent CREATE TABLE IF NOT EXISTS (or ADD COLUMN IF NOT EXISTS) race
// in PostgreSQL's catalogue, and one fails with a unique violation (type
// "payments" already exists). The lock is per database: the demo's tables
// in two schemas of one database migrate one after the other, which is
// harmless.
func (r PostgresRepo) migrateLocked(ctx context.Context, what string, fn func(context.Context, pgx.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	err := pgx.BeginFunc(ctx, r.Pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext('github.com/idemhq/idem/cmd/idem payments schema'))`); err != nil {
			return fmt.Errorf("take the migration lock: %w", err)
		}
		return fn(ctx, tx)
	})
	var se *SchemaError
	switch {
	case errors.As(err, &se):
		return err
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("payments: %s: not done within %v (another instance may hold the migration lock): %w", what, migrateTimeout, err)
	case err != nil:
		return fmt.Errorf("payments: %s: %w", what, err)
	}
	return nil
}

// pgTable is the existing payments table as the catalogue describes it.
type pgTable struct {
	oid     uint32
	name    string // schema-qualified
	kind    string // pg_class.relkind
	columns []tableColumn
}

// pgPaymentsTable returns the relation the demo's unqualified "payments"
// names (through the search_path), or nil if there is none.
func pgPaymentsTable(ctx context.Context, tx pgx.Tx) (*pgTable, error) {
	var t pgTable
	err := tx.QueryRow(ctx, `SELECT c.oid, quote_ident(n.nspname) || '.' || quote_ident(c.relname), c.relkind::text
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass('payments')`).Scan(&t.oid, &t.name, &t.kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up the payments table: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod),
			a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = ''
		FROM pg_catalog.pg_attribute a
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, t.oid)
	if err != nil {
		return nil, fmt.Errorf("look up the payments table's columns: %w", err)
	}
	t.columns, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (tableColumn, error) {
		var c tableColumn
		err := row.Scan(&c.name, &c.typ, &c.required)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("look up the payments table's columns: %w", err)
	}
	return &t, nil
}

// check returns a *SchemaError unless t has every column of want and,
// where they exist, the columns of optional, with the demo's types, and no
// other column an insert must set.
func (t *pgTable) check(ctx context.Context, tx pgx.Tx, want, optional []column) error {
	fail := func(problems []string) error {
		return &SchemaError{Table: t.name, Problems: problems,
			Fix: "give --db another database for the demo (CREATE DATABASE idem_demo; --db postgres://…/idem_demo), " +
				"or rename that table (ALTER TABLE " + t.name + " RENAME TO …) if it is yours to change"}
	}
	if t.kind != "r" && t.kind != "p" {
		return fail([]string{"it is not a table (pg_class.relkind " + t.kind + ")"})
	}
	if problems := shapeProblems(t.columns, want, optional, func(c column) string { return c.pg }); len(problems) > 0 {
		return fail(problems)
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
	insert := `INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`
	if !r.SameTx {
		insert += onConflictPostgres
	}
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
	if tag.RowsAffected() == 0 && !r.SameTx {
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

// onConflictPostgres makes an insert leave the payment already stored for
// the tenant and key in place (records kept elsewhere).
const onConflictPostgres = ` ON CONFLICT (tenant, idempotency_key) DO NOTHING`

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
