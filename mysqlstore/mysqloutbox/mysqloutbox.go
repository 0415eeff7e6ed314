// Package mysqloutbox keeps an outbox (see package outbox) in MariaDB, so
// that messages commit in the same transaction as an idempotent
// operation's business rows and its stored response (mysqlstore.Tx).
//
//	ob, _ := mysqloutbox.New(db, nil)
//	_ = ob.Migrate(ctx)
//	// inside the handler, after the business writes:
//	err := ob.Add(r.Context(), outbox.Message{ID: "payment.created:" + id, Topic: "idem.payments.created", Payload: event})
//	// and, in every process:
//	d, _ := outbox.NewDispatcher(ob, publisher, nil)
//	go d.Run(ctx)
//
// The table is the outbox's own (default idem_outbox), created by Migrate
// in the connection's database. Claims are leases on rows, decided by the
// server's clock (UTC_TIMESTAMP(6)). The claims of all dispatchers are
// serialised by a named lock (GET_LOCK), so that the rule "no message of a
// key while an earlier one is held" sees every committed claim; rows
// another transaction holds are skipped (FOR UPDATE SKIP LOCKED) rather
// than waited for. Publishing happens outside any transaction.
package mysqloutbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/idemhq/idem/mysqlstore"
	"github.com/idemhq/idem/outbox"
)

// DefaultTable names the outbox table.
const DefaultTable = "idem_outbox"

// claimLockWait bounds how long a claim waits for another dispatcher's
// claim (whole seconds: GET_LOCK's granularity on MariaDB).
const claimLockWait = 5

// Config configures a Store. A nil *Config means all defaults.
type Config struct {
	// Table names the outbox table in the connection's database: a-z,
	// 0-9 and _, starting with a letter or _, at most 48 bytes. Defaults
	// to "idem_outbox".
	Table string
}

var identifier = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

// Store is an outbox table in MariaDB. It implements outbox.Store and
// outbox.Inspector.
type Store struct {
	db    *sql.DB
	table string // quoted
	name  string
}

var (
	_ outbox.Store     = (*Store)(nil)
	_ outbox.Inspector = (*Store)(nil)
)

// New returns the outbox in the database of db, which the caller owns
// (the *sql.DB of the mysqlstore.Store, so that Add joins its
// transactions). It runs no statement; call Migrate once.
func New(db *sql.DB, cfg *Config) (*Store, error) {
	name := DefaultTable
	if cfg != nil && cfg.Table != "" {
		name = cfg.Table
	}
	if db == nil {
		return nil, errors.New("mysqloutbox: nil *sql.DB")
	}
	if !identifier.MatchString(name) {
		return nil, fmt.Errorf("mysqloutbox: table %q is not a valid name: use a-z, 0-9 and _, start with a letter or _, at most 48 bytes", name)
	}
	return &Store{db: db, table: "`" + name + "`", name: name}, nil
}

const now = "UTC_TIMESTAMP(6)"

func micros(col string) string {
	return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + col + ")"
}

// Migrate creates the outbox table and its indexes if they do not exist.
// The statement is idempotent, so concurrent calls (several processes
// starting) are safe.
func (s *Store) Migrate(ctx context.Context) error {
	// MariaDB has no partial indexes: (sent_at, seq) serves the unsent
	// messages in order (sent_at IS NULL) and cleanup by send time.
	_, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+s.table+` (
		seq         BIGINT         NOT NULL AUTO_INCREMENT PRIMARY KEY,
		id          VARBINARY(255) NOT NULL,
		topic       VARBINARY(255) NOT NULL,
		okey        VARBINARY(255) NOT NULL,
		payload     LONGBLOB       NOT NULL,
		headers     LONGTEXT       NOT NULL,
		created_at  DATETIME(6)    NOT NULL,
		sent_at     DATETIME(6)    NULL,
		claimed_by  VARBINARY(255) NULL,
		claim_until DATETIME(6)    NULL,
		attempts    INT            NOT NULL DEFAULT 0,
		UNIQUE KEY `+"`"+s.name+"_id`"+` (id),
		KEY `+"`"+s.name+"_unsent`"+` (sent_at, seq),
		KEY `+"`"+s.name+"_key`"+` (okey, sent_at, seq)
	) ENGINE = InnoDB`)
	if err != nil {
		return fmt.Errorf("mysqloutbox: migrate: %w", err)
	}
	return nil
}

// Add adds msgs to the outbox inside the transaction of the idempotent
// execution ctx belongs to (mysqlstore.Tx): they commit with the
// operation's business rows and stored response, or not at all. Outside
// such an execution it returns an error wrapping idem.ErrNoTx. See AddTx.
func (s *Store) Add(ctx context.Context, msgs ...outbox.Message) error {
	tx, err := mysqlstore.Tx(ctx)
	if err != nil {
		return fmt.Errorf("mysqloutbox: add: %w", err)
	}
	return s.AddTx(ctx, tx, msgs...)
}

// AddTx adds msgs in the caller's transaction tx, on this database. A
// message without an ID gets a random one. A message whose ID is already in
// the outbox (until cleanup removes it) is not added again, so that a
// re-executed operation does not publish its event twice.
func (s *Store) AddTx(ctx context.Context, tx *sql.Tx, msgs ...outbox.Message) error {
	if tx == nil {
		return errors.New("mysqloutbox: add: nil transaction")
	}
	for i := range msgs {
		m, h, err := outbox.PrepareRow(msgs[i])
		if err != nil {
			return fmt.Errorf("mysqloutbox: add: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.table+` (id, topic, okey, payload, headers, created_at)
			VALUES (?, ?, ?, ?, ?, `+now+`) ON DUPLICATE KEY UPDATE id = id`, m.ID, m.Topic, m.Key, m.Payload, h); err != nil {
			return fmt.Errorf("mysqloutbox: add: %w", err)
		}
	}
	return nil
}

// Claim implements outbox.Store, with the server's clock.
func (s *Store) Claim(ctx context.Context, p outbox.ClaimParams) ([]outbox.Message, error) {
	if p.Limit <= 0 || p.Owner == "" {
		return nil, errors.New("mysqloutbox: claim needs an owner and a positive limit")
	}
	msgs, err := s.claim(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("mysqloutbox: claim: %w", err)
	}
	return msgs, nil
}

func (s *Store) claim(ctx context.Context, p outbox.ClaimParams) (msgs []outbox.Message, err error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	lock := "CONCAT('idem_outbox:', SHA1(CONCAT(COALESCE(DATABASE(), ''), '.', ?)))"
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK("+lock+", ?)", s.name, claimLockWait).Scan(&got); err != nil {
		return nil, err
	}
	if got.Int64 != 1 {
		return nil, errors.New("another dispatcher's claim held the claim lock too long")
	}
	defer func() {
		_, _ = conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK("+lock+")", s.name)
	}()
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	t := s.table
	rows, err := tx.QueryContext(ctx, `SELECT o.seq, o.id, o.topic, o.okey, o.payload, o.headers FROM `+t+` o
		WHERE o.sent_at IS NULL AND (o.claim_until IS NULL OR o.claim_until <= `+now+`)
		  AND (o.okey = '' OR NOT EXISTS (
			SELECT 1 FROM `+t+` e
			WHERE e.okey = o.okey AND e.seq < o.seq AND e.sent_at IS NULL AND e.claim_until > `+now+`))
		ORDER BY o.seq LIMIT ? FOR UPDATE SKIP LOCKED`, p.Limit)
	if err != nil {
		return nil, err
	}
	var seqs []any
	for rows.Next() {
		var m outbox.Message
		var h string
		if err := rows.Scan(&m.Seq, &m.ID, &m.Topic, &m.Key, &m.Payload, &h); err != nil {
			rows.Close()
			return nil, err
		}
		if m.Headers, err = outbox.DecodeHeaders(h); err != nil {
			rows.Close()
			return nil, err
		}
		msgs = append(msgs, m)
		seqs = append(seqs, m.Seq)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if msgs, err = keepKeyOrder(ctx, tx, t, msgs); err != nil {
		return nil, err
	}
	if len(msgs) == 0 {
		return nil, tx.Rollback()
	}
	seqs = seqs[:0]
	for _, m := range msgs {
		seqs = append(seqs, m.Seq)
	}
	args := append([]any{p.Owner, p.Lease.Microseconds()}, seqs...)
	if _, err := tx.ExecContext(ctx, `UPDATE `+t+` SET claimed_by = ?, claim_until = `+now+` + INTERVAL ? MICROSECOND, attempts = attempts + 1
		WHERE seq IN (`+placeholders(len(seqs))+`)`, args...); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return msgs, nil
}

// keepKeyOrder drops from a claimed batch every message of a key that
// has an earlier unsent message outside the batch. SKIP LOCKED passes over
// the rows of a transaction still committing; when that transaction
// commits while the scan goes on, InnoDB's locking read returns its later
// rows but not the earlier ones it skipped, and those later rows would be
// published first. A fresh read (READ COMMITTED) of the keys' unsent
// sequence numbers sees the whole committed transaction, so a key's
// messages are kept only up to the first one the batch lacks.
func keepKeyOrder(ctx context.Context, tx *sql.Tx, table string, msgs []outbox.Message) ([]outbox.Message, error) {
	keys := map[string]int64{} // key -> the batch's highest seq of it
	for _, m := range msgs {
		if m.Key != "" {
			keys[m.Key] = max(keys[m.Key], m.Seq)
		}
	}
	if len(keys) == 0 {
		return msgs, nil
	}
	inBatch := make(map[int64]bool, len(msgs))
	for _, m := range msgs {
		inBatch[m.Seq] = true
	}
	args := make([]any, 0, len(keys))
	for k := range keys {
		args = append(args, k)
	}
	rows, err := tx.QueryContext(ctx, `SELECT okey, seq FROM `+table+`
		WHERE sent_at IS NULL AND okey IN (`+placeholders(len(args))+`) ORDER BY okey, seq`, args...)
	if err != nil {
		return nil, err
	}
	firstGap := map[string]int64{} // key -> the lowest unsent seq the batch lacks
	for rows.Next() {
		var k string
		var seq int64
		if err := rows.Scan(&k, &seq); err != nil {
			rows.Close()
			return nil, err
		}
		if _, seen := firstGap[k]; !seen && !inBatch[seq] && seq < keys[k] {
			firstGap[k] = seq
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(firstGap) == 0 {
		return msgs, nil
	}
	kept := msgs[:0]
	for _, m := range msgs {
		if gap, ok := firstGap[m.Key]; ok && m.Seq > gap {
			continue
		}
		kept = append(kept, m)
	}
	return kept, nil
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

func seqArgs(seqs []int64) []any {
	out := make([]any, len(seqs))
	for i, s := range seqs {
		out[i] = s
	}
	return out
}

// MarkSent implements outbox.Store.
func (s *Store) MarkSent(ctx context.Context, owner string, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	_, err := s.db.ExecContext(ctx, `UPDATE `+s.table+` SET sent_at = `+now+`, claimed_by = NULL, claim_until = NULL
		WHERE seq IN (`+placeholders(len(seqs))+`) AND sent_at IS NULL`, seqArgs(seqs)...)
	if err != nil {
		return fmt.Errorf("mysqloutbox: mark sent: %w", err)
	}
	return nil
}

// Release implements outbox.Store.
func (s *Store) Release(ctx context.Context, owner string, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	_, err := s.db.ExecContext(ctx, `UPDATE `+s.table+` SET claimed_by = NULL, claim_until = NULL
		WHERE seq IN (`+placeholders(len(seqs))+`) AND claimed_by = ? AND sent_at IS NULL`, append(seqArgs(seqs), owner)...)
	if err != nil {
		return fmt.Errorf("mysqloutbox: release: %w", err)
	}
	return nil
}

// DeleteSent implements outbox.Store.
func (s *Store) DeleteSent(ctx context.Context, before time.Time, limit int) (int, error) {
	if limit <= 0 {
		return 0, errors.New("mysqloutbox: DeleteSent needs a positive limit")
	}
	res, err := s.db.ExecContext(ctx, `DELETE FROM `+s.table+` WHERE sent_at IS NOT NULL
		AND sent_at <= TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00') ORDER BY sent_at LIMIT ?`, before.UnixMicro(), limit)
	if err != nil {
		return 0, fmt.Errorf("mysqloutbox: delete sent: %w", err)
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// Pending returns how many messages are not yet sent: for health checks
// and tests.
func (s *Store) Pending(ctx context.Context) (int64, error) {
	var n int64
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+s.table+` WHERE sent_at IS NULL`).Scan(&n); err != nil {
		return 0, fmt.Errorf("mysqloutbox: pending: %w", err)
	}
	return n, nil
}

// pendingColumns are the columns of an unsent message for Inspector; the
// claim counts only while its lease (the server's clock) lasts.
var pendingColumns = `seq, id, topic, okey, LENGTH(payload), ` + micros("created_at") + `, attempts,
	IF(claim_until > ` + now + `, ` + micros("claim_until") + `, NULL)`

// scanPending reads pendingColumns (and payload, headers if withPayload).
func scanPending(sc interface{ Scan(...any) error }, withPayload bool) (outbox.PendingMessage, error) {
	var (
		m       outbox.PendingMessage
		created int64
		until   sql.NullInt64
		h       string
	)
	dst := []any{&m.Seq, &m.ID, &m.Topic, &m.Key, &m.Size, &created, &m.Attempts, &until}
	if withPayload {
		dst = append(dst, &m.Payload, &h)
	}
	if err := sc.Scan(dst...); err != nil {
		return m, err
	}
	m.CreatedAt = time.UnixMicro(created).UTC()
	if until.Valid {
		m.ClaimedUntil = time.UnixMicro(until.Int64).UTC()
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
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.tables
		WHERE table_schema = DATABASE() AND table_name = ?`, s.name).Scan(&n); err != nil {
		return false, fmt.Errorf("mysqloutbox: exists: %w", err)
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
		` WHERE sent_at IS NULL ORDER BY seq LIMIT 1`), false)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil, nil // sent since the count
	}
	if err != nil {
		return 0, nil, fmt.Errorf("mysqloutbox: backlog: %w", err)
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
		return nil, fmt.Errorf("mysqloutbox: list pending: %w", err)
	}
	defer rows.Close()
	var out []outbox.PendingMessage
	for rows.Next() {
		m, err := scanPending(rows, p.WithPayload)
		if err != nil {
			return nil, fmt.Errorf("mysqloutbox: list pending: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mysqloutbox: list pending: %w", err)
	}
	return out, nil
}

// GetPending implements outbox.Inspector.
func (s *Store) GetPending(ctx context.Context, seq int64) (outbox.PendingMessage, error) {
	m, err := scanPending(s.db.QueryRowContext(ctx, `SELECT `+pendingColumns+`, payload, headers FROM `+s.table+
		` WHERE seq = ? AND sent_at IS NULL`, seq), true)
	if errors.Is(err, sql.ErrNoRows) {
		return m, outbox.ErrNotPending
	}
	if err != nil {
		return m, fmt.Errorf("mysqloutbox: pending: %w", err)
	}
	return m, nil
}

// RetryNow implements outbox.Inspector.
func (s *Store) RetryNow(ctx context.Context, seq int64) error {
	res, err := s.db.ExecContext(ctx, `UPDATE `+s.table+` SET claimed_by = NULL, claim_until = NULL
		WHERE seq = ? AND sent_at IS NULL`, seq)
	if err != nil {
		return fmt.Errorf("mysqloutbox: retry: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		// Unchanged (no claim to clear) or absent: tell them apart.
		var one int
		err := s.db.QueryRowContext(ctx, `SELECT 1 FROM `+s.table+` WHERE seq = ? AND sent_at IS NULL`, seq).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return outbox.ErrNotPending
		}
		if err != nil {
			return fmt.Errorf("mysqloutbox: retry: %w", err)
		}
	}
	return nil
}
