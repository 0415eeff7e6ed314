// Package sqliteoutbox keeps an outbox (see package outbox) in the SQLite
// file of a sqlitestore.Store, so that messages commit in the same
// transaction as an idempotent operation's business rows and its stored
// response.
//
//	ob, _ := sqliteoutbox.New(store.DB(), nil)
//	_ = ob.Migrate(ctx)
//	// inside the handler, after the business writes:
//	err := ob.Add(r.Context(), outbox.Message{ID: "payment.created:" + id, Topic: "idem.payments.created", Payload: event})
//	// and, once per process:
//	d, _ := outbox.NewDispatcher(ob, publisher, nil)
//	go d.Run(ctx)
//
// The table is the outbox's own (default idem_outbox), created by Migrate;
// the store's records table is untouched. Claims are leases written in a
// short write transaction (SQLite has one writer at a time, so claims of
// several dispatchers are serialised and never overlap); time comes from
// Config.NowFunc and the dispatcher's clock.
package sqliteoutbox

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/outbox"
	"github.com/idemhq/idem/sqlitestore"
)

// DefaultTable names the outbox table.
const DefaultTable = "idem_outbox"

// Config configures a Store. A nil *Config means all defaults.
type Config struct {
	// Table names the outbox table, a plain SQL identifier. Defaults to
	// "idem_outbox".
	Table string
	// NowFunc is the clock that stamps messages when they are added and
	// sent. Defaults to time.Now.
	NowFunc func() time.Time
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Store is an outbox table in a SQLite database. It implements
// outbox.Store.
type Store struct {
	db    *sql.DB
	table string
	now   func() time.Time
}

var _ outbox.Store = (*Store)(nil)

// New returns the outbox in db, which must be able to write: pass
// sqlitestore.Store.DB(), whose single writer connection the outbox then
// shares with the records (SQLite has one writer at a time). New runs no
// statement; call Migrate once.
func New(db *sql.DB, cfg *Config) (*Store, error) {
	s := &Store{db: db, table: DefaultTable, now: time.Now}
	if cfg != nil {
		if cfg.Table != "" {
			s.table = cfg.Table
		}
		if cfg.NowFunc != nil {
			s.now = cfg.NowFunc
		}
	}
	if db == nil {
		return nil, errors.New("sqliteoutbox: nil database")
	}
	if !identifier.MatchString(s.table) {
		return nil, fmt.Errorf("sqliteoutbox: table %q is not a plain SQL identifier", s.table)
	}
	return s, nil
}

// Migrate creates the outbox table and its indexes if they do not exist.
func (s *Store) Migrate(ctx context.Context) error {
	t := s.table
	_, err := s.db.ExecContext(ctx, `
		CREATE TABLE IF NOT EXISTS `+t+` (
			seq         INTEGER PRIMARY KEY AUTOINCREMENT,
			id          TEXT    NOT NULL UNIQUE,
			topic       TEXT    NOT NULL,
			okey        TEXT    NOT NULL,
			payload     BLOB    NOT NULL,
			headers     TEXT    NOT NULL,
			created_at  INTEGER NOT NULL,
			sent_at     INTEGER,
			claimed_by  TEXT,
			claim_until INTEGER,
			attempts    INTEGER NOT NULL DEFAULT 0
		);
		CREATE INDEX IF NOT EXISTS `+t+`_unsent ON `+t+` (seq) WHERE sent_at IS NULL;
		CREATE INDEX IF NOT EXISTS `+t+`_key ON `+t+` (okey, seq) WHERE sent_at IS NULL AND okey <> '';
		CREATE INDEX IF NOT EXISTS `+t+`_sent ON `+t+` (sent_at) WHERE sent_at IS NOT NULL;`)
	if err != nil {
		return fmt.Errorf("sqliteoutbox: migrate: %w", err)
	}
	return nil
}

// Add adds msgs to the outbox inside the transaction of the idempotent
// execution ctx belongs to (sqlitestore.Tx): they commit with the
// operation's business rows and stored response, or not at all. Outside
// such an execution it returns an error wrapping idem.ErrNoTx. See AddTx.
func (s *Store) Add(ctx context.Context, msgs ...outbox.Message) error {
	tx, err := sqlitestore.Tx(ctx)
	if err != nil {
		return fmt.Errorf("sqliteoutbox: add: %w", err)
	}
	return s.AddTx(ctx, tx, msgs...)
}

// AddTx adds msgs in the caller's transaction tx, which must be on this
// database. A message without an ID gets a random one. A message whose ID
// is already in the outbox (until cleanup removes it) is not added again,
// so that a re-executed operation does not publish its event twice.
func (s *Store) AddTx(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) error {
	if tx == nil {
		return errors.New("sqliteoutbox: add: nil transaction")
	}
	now := s.now().UnixNano()
	for i := range msgs {
		m, h, err := outbox.PrepareRow(msgs[i])
		if err != nil {
			return fmt.Errorf("sqliteoutbox: add: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.table+` (id, topic, okey, payload, headers, created_at)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`, m.ID, m.Topic, m.Key, m.Payload, h, now); err != nil {
			return fmt.Errorf("sqliteoutbox: add: %w", err)
		}
	}
	return nil
}

// Claim implements outbox.Store with one UPDATE ... RETURNING.
func (s *Store) Claim(ctx context.Context, p outbox.ClaimParams) ([]outbox.Message, error) {
	if p.Limit <= 0 || p.Owner == "" {
		return nil, errors.New("sqliteoutbox: claim needs an owner and a positive limit")
	}
	now := p.Now.UnixNano()
	t := s.table
	rows, err := s.db.QueryContext(ctx, `
		UPDATE `+t+` SET claimed_by = ?1, claim_until = ?2, attempts = attempts + 1
		WHERE seq IN (
			SELECT o.seq FROM `+t+` o
			WHERE o.sent_at IS NULL AND (o.claim_until IS NULL OR o.claim_until <= ?3)
			  AND (o.okey = '' OR NOT EXISTS (
				SELECT 1 FROM `+t+` e
				WHERE e.okey = o.okey AND e.seq < o.seq AND e.sent_at IS NULL AND e.claim_until > ?3))
			ORDER BY o.seq LIMIT ?4)
		RETURNING seq, id, topic, okey, payload, headers`,
		p.Owner, now+p.Lease.Nanoseconds(), now, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("sqliteoutbox: claim: %w", err)
	}
	defer rows.Close()
	var msgs []outbox.Message
	for rows.Next() {
		var m outbox.Message
		var h string
		if err := rows.Scan(&m.Seq, &m.ID, &m.Topic, &m.Key, &m.Payload, &h); err != nil {
			return nil, fmt.Errorf("sqliteoutbox: claim: %w", err)
		}
		if m.Headers, err = outbox.DecodeHeaders(h); err != nil {
			return nil, err
		}
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqliteoutbox: claim: %w", err)
	}
	// RETURNING has no order of its own.
	slices.SortFunc(msgs, func(a, b outbox.Message) int { return cmp.Compare(a.Seq, b.Seq) })
	return msgs, nil
}

func seqList(seqs []int64) string {
	b, _ := json.Marshal(seqs)
	return string(b)
}

// MarkSent implements outbox.Store.
func (s *Store) MarkSent(ctx context.Context, owner string, seqs []int64) error {
	_, err := s.db.ExecContext(ctx, `UPDATE `+s.table+` SET sent_at = ?, claimed_by = NULL, claim_until = NULL
		WHERE seq IN (SELECT value FROM json_each(?)) AND sent_at IS NULL`, s.now().UnixNano(), seqList(seqs))
	if err != nil {
		return fmt.Errorf("sqliteoutbox: mark sent: %w", err)
	}
	return nil
}

// Release implements outbox.Store.
func (s *Store) Release(ctx context.Context, owner string, seqs []int64) error {
	_, err := s.db.ExecContext(ctx, `UPDATE `+s.table+` SET claimed_by = NULL, claim_until = NULL
		WHERE seq IN (SELECT value FROM json_each(?)) AND claimed_by = ? AND sent_at IS NULL`, seqList(seqs), owner)
	if err != nil {
		return fmt.Errorf("sqliteoutbox: release: %w", err)
	}
	return nil
}

// DeleteSent implements outbox.Store.
func (s *Store) DeleteSent(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, errors.New("sqliteoutbox: DeleteSent needs a positive limit")
	}
	res, err := s.db.ExecContext(ctx, `DELETE FROM `+s.table+` WHERE seq IN (
		SELECT seq FROM `+s.table+` WHERE sent_at IS NOT NULL AND sent_at <= ? ORDER BY sent_at LIMIT ?)`, before.UnixNano(), limit)
	if err != nil {
		return 0, fmt.Errorf("sqliteoutbox: delete sent: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// Pending returns how many messages are not yet sent: for health checks
// and tests.
func (s *Store) Pending(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+s.table+` WHERE sent_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("sqliteoutbox: pending: %w", err)
	}
	return n, nil
}

var _ outbox.Inspector = (*Store)(nil)

// pendingColumns are the columns of an unsent message for Inspector
// (payload and headers last, selected only when asked for).
const pendingColumns = `seq, id, topic, okey, length(payload), created_at, attempts, COALESCE(claim_until, 0)`

// scanPending reads pendingColumns (and payload, headers if withPayload).
func scanPending(sc interface{ Scan(...any) error }, withPayload bool, now int64) (outbox.PendingMessage, error) {
	var (
		m              outbox.PendingMessage
		created, until int64
		h              string
	)
	dst := []any{&m.Seq, &m.ID, &m.Topic, &m.Key, &m.Size, &created, &m.Attempts, &until}
	if withPayload {
		dst = append(dst, &m.Payload, &h)
	}
	if err := sc.Scan(dst...); err != nil {
		return m, err
	}
	m.CreatedAt = time.Unix(0, created).UTC()
	if until > now {
		m.ClaimedUntil = time.Unix(0, until).UTC()
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
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?`, s.table).Scan(&n); err != nil {
		return false, fmt.Errorf("sqliteoutbox: exists: %w", err)
	}
	return n > 0, nil
}

// Backlog implements outbox.Inspector, through the index of unsent
// messages.
func (s *Store) Backlog(ctx context.Context) (int64, *outbox.PendingMessage, error) {
	n, err := s.Pending(ctx)
	if err != nil || n == 0 {
		return n, nil, err
	}
	m, err := scanPending(s.db.QueryRowContext(ctx, `SELECT `+pendingColumns+` FROM `+s.table+
		` WHERE sent_at IS NULL ORDER BY seq LIMIT 1`), false, s.now().UnixNano())
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil, nil // sent since the count
	}
	if err != nil {
		return 0, nil, fmt.Errorf("sqliteoutbox: backlog: %w", err)
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
	rows, err := s.db.QueryContext(ctx, `SELECT `+cols+` FROM `+s.table+
		` WHERE sent_at IS NULL AND seq > ? ORDER BY seq LIMIT ?`, p.After, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("sqliteoutbox: list pending: %w", err)
	}
	defer rows.Close()
	now := s.now().UnixNano()
	var out []outbox.PendingMessage
	for rows.Next() {
		m, err := scanPending(rows, p.WithPayload, now)
		if err != nil {
			return nil, fmt.Errorf("sqliteoutbox: list pending: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqliteoutbox: list pending: %w", err)
	}
	return out, nil
}

// GetPending implements outbox.Inspector.
func (s *Store) GetPending(ctx context.Context, seq int64) (outbox.PendingMessage, error) {
	m, err := scanPending(s.db.QueryRowContext(ctx, `SELECT `+pendingColumns+`, payload, headers FROM `+s.table+
		` WHERE seq = ? AND sent_at IS NULL`, seq), true, s.now().UnixNano())
	if errors.Is(err, sql.ErrNoRows) {
		return m, outbox.ErrNotPending
	}
	if err != nil {
		return m, fmt.Errorf("sqliteoutbox: pending: %w", err)
	}
	return m, nil
}

// RetryNow implements outbox.Inspector.
func (s *Store) RetryNow(ctx context.Context, seq int64) error {
	res, err := s.db.ExecContext(ctx, `UPDATE `+s.table+` SET claimed_by = NULL, claim_until = NULL
		WHERE seq = ? AND sent_at IS NULL`, seq)
	if err != nil {
		return fmt.Errorf("sqliteoutbox: retry: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return outbox.ErrNotPending
	}
	return nil
}

// errNoTx keeps the idem import honest for documentation links.
var _ = idem.ErrNoTx
