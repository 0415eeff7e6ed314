package payments

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/sqlitestore"
)

// SQLiteRepo keeps payments in the SQLite file of a sqlitestore.Store.
type SQLiteRepo struct {
	Store *sqlitestore.Store
	// SameTx says that each payment's row commits in one transaction
	// with its completed record (idem serve without --store and without
	// --provider): the table then needs no unique index on (tenant,
	// idempotency_key), and Migrate removes it (see keyIndexName). Without it, Migrate creates the index
	// and Insert returns the payment already stored for the same tenant
	// and key.
	SameTx bool
	// st holds the statements Prepare compiled; nil: every call has its
	// SQL parsed again.
	st *sqliteStatements
}

// sqliteStatements are the request path's statements, compiled once:
// the insert runs while SQLite's single writer is held, where parsing it
// per request lengthens every other writer's wait.
type sqliteStatements struct {
	insert, get *sql.Stmt
}

const (
	insertSQLite = `INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)`
	onConflictSQLite = ` ON CONFLICT (tenant, idempotency_key) DO NOTHING`
	getSQLite        = selectSQLite + ` WHERE tenant = ? AND id = ?`
)

// insertSQL is the payment insert: with the records elsewhere, it leaves
// the payment already stored for the tenant and key in place.
func (r SQLiteRepo) insertSQL() string {
	if r.SameTx {
		return insertSQLite
	}
	return insertSQLite + onConflictSQLite
}

// Prepare returns the repo with its request-path statements (Insert on
// the writer, Get on the readers) prepared once; call it after Migrate,
// and Close the returned repo before the store.
func (r SQLiteRepo) Prepare(ctx context.Context) (SQLiteRepo, error) {
	ins, err := r.Store.DB().PrepareContext(ctx, r.insertSQL())
	if err != nil {
		return r, fmt.Errorf("payments: prepare: %w", err)
	}
	get, err := r.Store.ReadDB().PrepareContext(ctx, getSQLite)
	if err != nil {
		ins.Close()
		return r, fmt.Errorf("payments: prepare: %w", err)
	}
	r.st = &sqliteStatements{insert: ins, get: get}
	return r, nil
}

// Close closes the statements Prepare compiled.
func (r SQLiteRepo) Close() error {
	if r.st == nil {
		return nil
	}
	return errors.Join(r.st.insert.Close(), r.st.get.Close())
}

// withoutRowID makes a new payments table a WITHOUT ROWID table
// (https://sqlite.org/withoutrowid.html): its rows are stored in the
// B-tree of the primary key id, so a payment writes one B-tree instead of
// two (the table's, in rowid order, and the id's index). A first payment
// then writes 5.6 WAL frames instead of 6.3 (TestSQLiteFramesPerPayment).
// A table created before keeps its rowid: CREATE TABLE IF NOT EXISTS
// leaves it as it is, and every statement of the demo reads and writes
// both kinds alike.
const withoutRowID = ` WITHOUT ROWID`

// Migrate implements Repo: it creates the payments table unless it
// exists, and checks that an existing one is the demo's: a table of
// another shape is a *SchemaError. It runs in one immediate transaction
// (sqlitestore's writer), so that processes sharing the file migrate one
// after the other.
func (r SQLiteRepo) Migrate(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, migrateTimeout)
	defer cancel()
	tx, err := r.Store.DB().BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("payments: migrate: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, createTable("INTEGER", "TEXT")+withoutRowID); err != nil {
		return fmt.Errorf("payments: migrate: %w", err)
	}
	if err := checkSQLiteTable(ctx, tx, baseColumns, stepColumns); err != nil {
		return err
	}
	if err := r.migrateKeyIndex(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("payments: migrate: %w", err)
	}
	return nil
}

// migrateKeyIndex gives the table the unique index on (tenant,
// idempotency_key) unless the records share the payment's transaction,
// and takes it away if they do (see keyIndexName): a table created
// before held it as a constraint, which SQLite can only drop by copying
// the table.
func (r SQLiteRepo) migrateKeyIndex(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, `SELECT l.name, l.origin FROM pragma_index_list('payments') l
		WHERE l."unique" AND NOT l.partial AND (SELECT group_concat(name, ',') FROM
			(SELECT name FROM pragma_index_info(l.name) ORDER BY seqno)) = 'tenant,idempotency_key'`)
	if err != nil {
		return fmt.Errorf("payments: migrate: %w", err)
	}
	var ours, constraint bool
	for rows.Next() {
		var name, origin string
		if err := rows.Scan(&name, &origin); err != nil {
			rows.Close()
			return fmt.Errorf("payments: migrate: %w", err)
		}
		ours = ours || name == keyIndexName
		constraint = constraint || origin == "u"
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("payments: migrate: %w", err)
	}
	switch {
	case !r.SameTx && (ours || constraint):
		return nil
	case !r.SameTx:
		_, err := tx.ExecContext(ctx, `CREATE UNIQUE INDEX `+keyIndexName+` ON payments (tenant, idempotency_key)`)
		var se interface{ Code() int }
		if errors.As(err, &se) && se.Code() == sqliteConstraintUnique {
			return errors.New("payments: migrate: " + errDuplicateKeys + "; keep the records in this file (no --store), or give --db another SQLite file")
		}
		if err != nil {
			return fmt.Errorf("payments: migrate: %w", err)
		}
		return nil
	}
	if ours {
		if _, err := tx.ExecContext(ctx, `DROP INDEX `+keyIndexName); err != nil {
			return fmt.Errorf("payments: migrate: %w", err)
		}
	}
	if constraint {
		if err := rebuildSQLite(ctx, tx); err != nil {
			return fmt.Errorf("payments: migrate: drop the unique constraint on (tenant, idempotency_key): %w", err)
		}
	}
	return nil
}

// rebuildSQLite copies the payments table into one with the same columns
// and no table constraint, and puts the copy in its place: SQLite's way of
// dropping a constraint (https://sqlite.org/lang_altertable.html#otheralter).
// The demo's table has no index of its own besides the primary key's.
func rebuildSQLite(ctx context.Context, tx *sql.Tx) error {
	rows, err := tx.QueryContext(ctx, `SELECT name, type, "notnull", dflt_value, pk FROM pragma_table_info('payments') ORDER BY cid`)
	if err != nil {
		return err
	}
	var defs, names []string
	for rows.Next() {
		var name, typ string
		var notNull bool
		var dflt sql.NullString
		var pk int
		if err := rows.Scan(&name, &typ, &notNull, &dflt, &pk); err != nil {
			rows.Close()
			return err
		}
		q := `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
		d := q + " " + typ
		if pk > 0 {
			d += " PRIMARY KEY"
		}
		if notNull {
			d += " NOT NULL"
		}
		if dflt.Valid {
			d += " DEFAULT " + dflt.String
		}
		defs, names = append(defs, d), append(names, q)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	cols := strings.Join(names, ", ")
	for _, q := range []string{
		`CREATE TABLE payments_rebuild (` + strings.Join(defs, ", ") + `)`,
		`INSERT INTO payments_rebuild (` + cols + `) SELECT ` + cols + ` FROM payments`,
		`DROP TABLE payments`,
		`ALTER TABLE payments_rebuild RENAME TO payments`,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return nil
}

// checkSQLiteTable returns a *SchemaError unless the payments table has
// every column of want and, where they exist, the columns of optional,
// with the demo's type affinities, and no other column an insert must set.
func checkSQLiteTable(ctx context.Context, tx *sql.Tx, want, optional []column) error {
	fail := func(problems []string) error {
		return &SchemaError{Table: "payments", Problems: problems,
			Fix: "give --db another SQLite file for the demo, or rename that table (ALTER TABLE payments RENAME TO …) if it is yours to change"}
	}
	var kind string
	if err := tx.QueryRowContext(ctx, `SELECT type FROM sqlite_schema WHERE name = 'payments' COLLATE NOCASE`).Scan(&kind); err != nil {
		return fmt.Errorf("payments: check the payments table: %w", err)
	}
	if kind != "table" {
		return fail([]string{"it is a " + kind + ", not a table"})
	}
	rows, err := tx.QueryContext(ctx, `SELECT name, type, "notnull" AND dflt_value IS NULL AND pk = 0 FROM pragma_table_info('payments')`)
	if err != nil {
		return fmt.Errorf("payments: check the payments table: %w", err)
	}
	var got []tableColumn
	for rows.Next() {
		var c tableColumn
		if err := rows.Scan(&c.name, &c.typ, &c.required); err != nil {
			rows.Close()
			return fmt.Errorf("payments: check the payments table: %w", err)
		}
		c.typ = sqliteAffinity(c.typ)
		got = append(got, c)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("payments: check the payments table: %w", err)
	}
	if problems := shapeProblems(got, want, optional, func(c column) string { return c.sqlite }); len(problems) > 0 {
		return fail(problems)
	}
	return nil
}

// Insert implements Repo. Inside an execution on a sqlitestore it writes
// through the execution's transaction; otherwise in its own. A row SQLite
// refuses as invalid (a constraint such as a CHECK, a value too big) is a
// *RejectedError; SQLite undoes only the refused statement, so the
// execution's transaction stays usable and the answer is stored with it.
func (r SQLiteRepo) Insert(ctx context.Context, p Payment) (Payment, error) {
	tx, err := sqlitestore.Tx(ctx)
	own := false
	if errors.Is(err, idem.ErrNoTx) {
		if tx, err = r.Store.DB().BeginTx(ctx, nil); err != nil {
			return Payment{}, fmt.Errorf("payments: insert: %w", err)
		}
		own = true
		defer tx.Rollback()
	} else if err != nil {
		return Payment{}, fmt.Errorf("payments: insert: %w", err)
	}
	args := []any{p.ID, p.tenant, p.key, p.AmountCents, p.Currency, p.Reference, p.CreatedAt.Format(time.RFC3339Nano)}
	var res sql.Result
	if r.st != nil {
		// The transaction's connection already holds the compiled
		// statement after its first use.
		res, err = tx.StmtContext(ctx, r.st.insert).ExecContext(ctx, args...)
	} else {
		res, err = tx.ExecContext(ctx, r.insertSQL(), args...)
	}
	if err != nil {
		if re := rejectedSQLite(err); re != nil {
			return Payment{}, re
		}
		return Payment{}, fmt.Errorf("payments: insert: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 && !r.SameTx {
		// The same tenant and key already paid: a re-execution after a
		// crash. Return that payment.
		if p, err = scanSQLite(tx.QueryRowContext(ctx, selectSQLite+` WHERE tenant = ? AND idempotency_key = ?`, p.tenant, p.key)); err != nil {
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

const selectSQLite = `SELECT id, amount_cents, currency, reference, created_at FROM payments`

func scanSQLite(row *sql.Row) (Payment, error) {
	var p Payment
	var created string
	if err := row.Scan(&p.ID, &p.AmountCents, &p.Currency, &p.Reference, &created); err != nil {
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

// Get implements Repo.
func (r SQLiteRepo) Get(ctx context.Context, tenant, id string) (Payment, error) {
	if r.st != nil {
		return scanSQLite(r.st.get.QueryRowContext(ctx, tenant, id))
	}
	return scanSQLite(r.Store.ReadDB().QueryRowContext(ctx, getSQLite, tenant, id))
}

// Count implements Repo.
func (r SQLiteRepo) Count(ctx context.Context) (int64, error) {
	var n int64
	err := r.Store.ReadDB().QueryRowContext(ctx, `SELECT COUNT(*) FROM payments`).Scan(&n)
	return n, err
}

// SQLite result codes (https://sqlite.org/rescode.html) of a refused row.
const (
	sqliteTooBig               = 18
	sqliteConstraint           = 19
	sqliteMismatch             = 20
	sqliteConstraintPrimaryKey = 1555
	sqliteConstraintUnique     = 2067
)

// rejectedSQLite returns a *RejectedError when err is SQLite refusing the
// row's data, nil otherwise. A unique or primary-key violation is not a
// refusal: the insert handles (tenant, key) itself, and a collision of the
// random id is worth a retry.
func rejectedSQLite(err error) *RejectedError {
	var se interface{ Code() int }
	if !errors.As(err, &se) {
		return nil
	}
	code := se.Code()
	switch {
	case code == sqliteConstraintPrimaryKey || code == sqliteConstraintUnique:
		return nil
	case code&0xff == sqliteConstraint, code&0xff == sqliteTooBig, code&0xff == sqliteMismatch:
		return &RejectedError{Reason: fmt.Sprintf("the database refused the payment (SQLite result code %d)", code), Err: err}
	}
	return nil
}
