// Package pgoutbox keeps an outbox (see package outbox) in PostgreSQL, so
// that messages commit in the same transaction as an idempotent
// operation's business rows and its stored response (pgstore.Tx).
//
//	ob, _ := pgoutbox.New(pool, nil) // or pgoutbox.NewDB(db, nil) with pgstore.NewDB
//	_ = ob.Migrate(ctx)
//	// inside the handler, after the business writes:
//	err := ob.Add(r.Context(), outbox.Message{ID: "payment.created:" + id, Topic: "idem.payments.created", Payload: event})
//	// and, in every process:
//	d, _ := outbox.NewDispatcher(ob, publisher, nil)
//	go d.Run(ctx)
//
// The table is the outbox's own (default idem.outbox), created by
// Migrate. Claims are leases on rows, decided by the server's clock
// (now()). Claim statements of all dispatchers are serialised by a
// transaction-scoped advisory lock, so that the rule "no message of a key
// while an earlier one is held" sees every committed claim; rows another
// transaction is updating are skipped (FOR UPDATE SKIP LOCKED) rather than
// waited for. Publishing happens outside any transaction.
package pgoutbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/pgstore/internal/pgdb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// Defaults of Config.
const (
	DefaultSchema = "idem"
	DefaultTable  = "outbox"
)

// Config configures a Store. A nil *Config means all defaults.
type Config struct {
	// Schema holds the outbox table; Migrate creates it if absent. A plain
	// SQL identifier. Defaults to "idem" (pgstore's default schema).
	Schema string
	// Table names the outbox table, a plain SQL identifier. Defaults to
	// "outbox".
	Table string
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Store is an outbox table in PostgreSQL. It implements outbox.Store.
type Store struct {
	db      pgdb.DB
	sqlMode bool // made by NewDB: Add uses pgstore.SQLTx
	schema  string
	table   string // quoted and schema-qualified
	name    string // the table's own name, for its indexes
	lockKey int64  // advisory lock key of the claims (a hash of the table name)
}

var _ outbox.Store = (*Store)(nil)

// New returns the outbox in the database of pool, which the caller owns.
// It runs no statement; call Migrate once.
func New(pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgoutbox: nil pool")
	}
	return build(pgdb.Pool{P: pool}, false, cfg)
}

// NewDB returns the outbox in the database of db, which the caller owns:
// a database/sql DB opened with pgx's stdlib driver, for a pgstore.Store
// made by pgstore.NewDB. It runs no statement; call Migrate once.
func NewDB(db *sql.DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("pgoutbox: nil *sql.DB")
	}
	if _, ok := db.Driver().(*stdlib.Driver); !ok {
		return nil, fmt.Errorf("pgoutbox: the *sql.DB's driver is a %T: open it with pgx's stdlib driver (github.com/jackc/pgx/v5/stdlib)", db.Driver())
	}
	return build(pgdb.SQL{D: db}, true, cfg)
}

func build(db pgdb.DB, sqlMode bool, cfg *Config) (*Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if !identifier.MatchString(c.Schema) || !identifier.MatchString(c.Table) {
		return nil, fmt.Errorf("pgoutbox: schema %q and table %q must be plain SQL identifiers", c.Schema, c.Table)
	}
	t := pgx.Identifier{c.Schema, c.Table}.Sanitize()
	h := fnv.New64a()
	h.Write([]byte("idem outbox claims " + t))
	return &Store{db: db, sqlMode: sqlMode, schema: c.Schema, table: t, name: c.Table, lockKey: int64(h.Sum64())}, nil
}

// Migrate creates the schema, the outbox table and its indexes if they do
// not exist. Concurrent calls (several processes starting) are serialised
// by an advisory lock.
func (s *Store) Migrate(ctx context.Context) error {
	t := s.table
	err := pgdb.BeginFunc(ctx, s.db, func(tx pgdb.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "idem outbox migrate "+t); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `
			CREATE SCHEMA IF NOT EXISTS `+pgx.Identifier{s.schema}.Sanitize()+`;
			CREATE TABLE IF NOT EXISTS `+t+` (
				seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
				id          TEXT        NOT NULL UNIQUE,
				topic       TEXT        NOT NULL,
				okey        TEXT        NOT NULL,
				payload     BYTEA       NOT NULL,
				headers     TEXT        NOT NULL,
				created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
				sent_at     TIMESTAMPTZ,
				claimed_by  TEXT,
				claim_until TIMESTAMPTZ,
				attempts    INTEGER     NOT NULL DEFAULT 0
			);
			CREATE INDEX IF NOT EXISTS `+s.indexName("unsent")+` ON `+t+` (seq) WHERE sent_at IS NULL;
			CREATE INDEX IF NOT EXISTS `+s.indexName("key")+` ON `+t+` (okey, seq) WHERE sent_at IS NULL AND okey <> '';
			CREATE INDEX IF NOT EXISTS `+s.indexName("sent")+` ON `+t+` (sent_at) WHERE sent_at IS NOT NULL;`)
		return err
	})
	if err != nil {
		return fmt.Errorf("pgoutbox: migrate: %w", err)
	}
	return nil
}

func (s *Store) indexName(suffix string) string {
	return pgx.Identifier{s.name + "_" + suffix}.Sanitize()
}

// Add adds msgs to the outbox inside the transaction of the idempotent
// execution ctx belongs to (pgstore.Tx, or pgstore.SQLTx for a Store made
// by NewDB): they commit with the operation's business rows and stored
// response, or not at all. Outside such an execution it returns an error
// wrapping idem.ErrNoTx. See AddTx.
func (s *Store) Add(ctx context.Context, msgs ...outbox.Message) error {
	if s.sqlMode {
		tx, err := pgstore.SQLTx(ctx)
		if err != nil {
			return fmt.Errorf("pgoutbox: add: %w", err)
		}
		return s.AddSQLTx(ctx, tx, msgs...)
	}
	tx, err := pgstore.Tx(ctx)
	if err != nil {
		return fmt.Errorf("pgoutbox: add: %w", err)
	}
	return s.AddTx(ctx, tx, msgs...)
}

// AddTx adds msgs in the caller's transaction tx, on this database. A
// message without an ID gets a random one. A message whose ID is already in
// the outbox (until cleanup removes it) is not added again, so that a
// re-executed operation does not publish its event twice.
func (s *Store) AddTx(ctx context.Context, tx pgx.Tx, msgs ...outbox.Message) error {
	if tx == nil {
		return errors.New("pgoutbox: add: nil transaction")
	}
	return s.add(ctx, pgdb.PgxTx{T: tx}, msgs)
}

// AddSQLTx is AddTx in a *sql.Tx on this database.
func (s *Store) AddSQLTx(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) error {
	if tx == nil {
		return errors.New("pgoutbox: add: nil transaction")
	}
	return s.add(ctx, &pgdb.SQLTx{T: tx}, msgs)
}

func (s *Store) add(ctx context.Context, tx pgdb.Querier, msgs []outbox.Message) error {
	for i := range msgs {
		m, h, err := outbox.PrepareRow(msgs[i])
		if err != nil {
			return fmt.Errorf("pgoutbox: add: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO `+s.table+` (id, topic, okey, payload, headers)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING`, m.ID, m.Topic, m.Key, m.Payload, h); err != nil {
			return fmt.Errorf("pgoutbox: add: %w", err)
		}
	}
	return nil
}

// Claim implements outbox.Store, with the server's clock.
func (s *Store) Claim(ctx context.Context, p outbox.ClaimParams) ([]outbox.Message, error) {
	if p.Limit <= 0 || p.Owner == "" {
		return nil, errors.New("pgoutbox: claim needs an owner and a positive limit")
	}
	t := s.table
	var msgs []outbox.Message
	err := pgdb.BeginFunc(ctx, s.db, func(tx pgdb.Tx) error {
		msgs = msgs[:0]
		// A claim lost in a server crash only makes its messages
		// claimable again: it need not wait for its WAL flush.
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off; SELECT pg_advisory_xact_lock(`+strconv.FormatInt(s.lockKey, 10)+`)`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
			UPDATE `+t+` SET claimed_by = $1, claim_until = now() + $2 * interval '1 microsecond', attempts = attempts + 1
			WHERE seq IN (
				SELECT o.seq FROM `+t+` o
				WHERE o.sent_at IS NULL AND (o.claim_until IS NULL OR o.claim_until <= now())
				  AND (o.okey = '' OR NOT EXISTS (
					SELECT 1 FROM `+t+` e
					WHERE e.okey = o.okey AND e.seq < o.seq AND e.sent_at IS NULL AND e.claim_until > now()))
				ORDER BY o.seq LIMIT $3
				FOR UPDATE SKIP LOCKED)
			RETURNING seq, id, topic, okey, payload, headers`,
			p.Owner, p.Lease.Microseconds(), p.Limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var m outbox.Message
			var h string
			if err := rows.Scan(&m.Seq, &m.ID, &m.Topic, &m.Key, &m.Payload, &h); err != nil {
				return err
			}
			if m.Headers, err = outbox.DecodeHeaders(h); err != nil {
				return err
			}
			msgs = append(msgs, m)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: claim: %w", err)
	}
	// RETURNING has no order of its own.
	slices.SortFunc(msgs, func(a, b outbox.Message) int { return cmp.Compare(a.Seq, b.Seq) })
	return msgs, nil
}

// MarkSent implements outbox.Store. The mark does not wait for its WAL
// flush: a mark lost in a server crash means the messages are published
// again (with their ids, so brokers and inboxes drop the copies), which
// at-least-once allows; it saves one flush per batch.
func (s *Store) MarkSent(ctx context.Context, owner string, seqs []int64) error {
	err := pgdb.BeginFunc(ctx, s.db, func(tx pgdb.Tx) error {
		_, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`)
		if err == nil {
			_, err = tx.Exec(ctx, `UPDATE `+s.table+` SET sent_at = now(), claimed_by = NULL, claim_until = NULL
				WHERE seq = ANY($1) AND sent_at IS NULL`, seqs)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("pgoutbox: mark sent: %w", err)
	}
	return nil
}

// Release implements outbox.Store.
func (s *Store) Release(ctx context.Context, owner string, seqs []int64) error {
	_, err := s.db.Exec(ctx, `UPDATE `+s.table+` SET claimed_by = NULL, claim_until = NULL
		WHERE seq = ANY($1) AND claimed_by = $2 AND sent_at IS NULL`, seqs, owner)
	if err != nil {
		return fmt.Errorf("pgoutbox: release: %w", err)
	}
	return nil
}

// DeleteSent implements outbox.Store.
func (s *Store) DeleteSent(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, errors.New("pgoutbox: DeleteSent needs a positive limit")
	}
	n, err := s.db.Exec(ctx, `DELETE FROM `+s.table+` WHERE seq IN (
		SELECT seq FROM `+s.table+` WHERE sent_at IS NOT NULL AND sent_at <= $1 ORDER BY sent_at LIMIT $2)`, before, limit)
	if err != nil {
		return 0, fmt.Errorf("pgoutbox: delete sent: %w", err)
	}
	return int(n), nil
}

// Pending returns how many messages are not yet sent: for health checks
// and tests.
func (s *Store) Pending(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRow(ctx, `SELECT COUNT(*) FROM `+s.table+` WHERE sent_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("pgoutbox: pending: %w", err)
	}
	return n, nil
}

var _ outbox.Inspector = (*Store)(nil)

// pendingColumns are the columns of an unsent message for Inspector; the
// claim counts only while its lease (the server's clock) lasts.
const pendingColumns = `seq, id, topic, okey, octet_length(payload), created_at, attempts,
	CASE WHEN claim_until > now() THEN claim_until END`

// scanPending reads pendingColumns (and payload, headers if withPayload).
func scanPending(row pgdb.Row, withPayload bool) (outbox.PendingMessage, error) {
	var (
		m     outbox.PendingMessage
		until *time.Time
		h     string
	)
	dst := []any{&m.Seq, &m.ID, &m.Topic, &m.Key, &m.Size, &m.CreatedAt, &m.Attempts, &until}
	if withPayload {
		dst = append(dst, &m.Payload, &h)
	}
	if err := row.Scan(dst...); err != nil {
		return m, err
	}
	m.CreatedAt = m.CreatedAt.UTC()
	if until != nil {
		m.ClaimedUntil = until.UTC()
	}
	if withPayload {
		var err error
		if m.Headers, err = outbox.DecodeHeaders(h); err != nil {
			return m, err
		}
	}
	return m, nil
}

// Exists reports whether the outbox table exists (Migrate ran), for
// operator tools that look for an outbox next to the records.
func (s *Store) Exists(ctx context.Context) (bool, error) {
	var ok bool
	if err := s.db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.table).Scan(&ok); err != nil {
		return false, fmt.Errorf("pgoutbox: exists: %w", err)
	}
	return ok, nil
}

// Backlog implements outbox.Inspector, through the index of unsent
// messages.
func (s *Store) Backlog(ctx context.Context) (int64, *outbox.PendingMessage, error) {
	n, err := s.Pending(ctx)
	if err != nil || n == 0 {
		return n, nil, err
	}
	m, err := scanPending(s.db.QueryRow(ctx, `SELECT `+pendingColumns+` FROM `+s.table+
		` WHERE sent_at IS NULL ORDER BY seq LIMIT 1`), false)
	if pgdb.IsNoRows(err) {
		return 0, nil, nil // sent since the count
	}
	if err != nil {
		return 0, nil, fmt.Errorf("pgoutbox: backlog: %w", err)
	}
	return n, &m, nil
}

// ListPending implements outbox.Inspector, through the index of unsent
// messages.
func (s *Store) ListPending(ctx context.Context, p outbox.ListPendingParams) ([]outbox.PendingMessage, error) {
	if err := outbox.CheckListLimit(p.Limit); err != nil {
		return nil, err
	}
	cols := pendingColumns
	if p.WithPayload {
		cols += `, payload, headers`
	}
	rows, err := s.db.Query(ctx, `SELECT `+cols+` FROM `+s.table+
		` WHERE sent_at IS NULL AND seq > $1 ORDER BY seq LIMIT $2`, p.After, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("pgoutbox: list pending: %w", err)
	}
	defer rows.Close()
	var out []outbox.PendingMessage
	for rows.Next() {
		m, err := scanPending(rows, p.WithPayload)
		if err != nil {
			return nil, fmt.Errorf("pgoutbox: list pending: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgoutbox: list pending: %w", err)
	}
	return out, nil
}

// GetPending implements outbox.Inspector.
func (s *Store) GetPending(ctx context.Context, seq int64) (outbox.PendingMessage, error) {
	m, err := scanPending(s.db.QueryRow(ctx, `SELECT `+pendingColumns+`, payload, headers FROM `+s.table+
		` WHERE seq = $1 AND sent_at IS NULL`, seq), true)
	if pgdb.IsNoRows(err) {
		return m, outbox.ErrNotPending
	}
	if err != nil {
		return m, fmt.Errorf("pgoutbox: pending: %w", err)
	}
	return m, nil
}

// RetryNow implements outbox.Inspector.
func (s *Store) RetryNow(ctx context.Context, seq int64) error {
	n, err := s.db.Exec(ctx, `UPDATE `+s.table+` SET claimed_by = NULL, claim_until = NULL
		WHERE seq = $1 AND sent_at IS NULL`, seq)
	if err != nil {
		return fmt.Errorf("pgoutbox: retry: %w", err)
	}
	if n == 0 {
		return outbox.ErrNotPending
	}
	return nil
}
