package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/internal/dupscore"
)

// Defaults of Config.
const (
	DefaultTable            = "idem_records"
	DefaultMaxResponseBytes = 1 << 20
	DefaultLockWait         = 100 * time.Millisecond
)

// maxHeaderBytes bounds the encoded status line and header fields stored
// with a response, on top of Config.MaxResponseBytes for the body.
const maxHeaderBytes = 64 << 10

// The widths of the scope and key columns (VARBINARY): InnoDB bounds an
// index entry at 3,072 bytes, and the primary key holds both.
const (
	maxScopeBytes = 2048
	maxKeyBytes   = 1024
)

// Config configures a Store. A nil *Config means all defaults, and so does
// each zero field.
type Config struct {
	// Table is the name of the records table in the connection's database.
	// Letters a-z, digits and underscores, starting with a letter or
	// underscore, at most 48 bytes. Defaults to "idem_records".
	Table string

	// MaxResponseBytes is the largest response body Complete stores; above
	// it Complete returns idemstore.ErrResponseTooLarge and changes nothing
	// (the core then completes the record as unreplayable, so the operation
	// is still never run twice). The encoded status and header fields may
	// add at most 64 KiB. The server's max_allowed_packet must hold a
	// response of that size: New checks it. Defaults to 1 MiB, the
	// middleware's default.
	MaxResponseBytes int

	// SkipMigrate makes New run no DDL: the table must already be at the
	// version this package expects (migrated by an earlier New, or by an
	// operator from the files in migrations/). Use it where the
	// application's database user may not run DDL. New still reads the
	// server's version. Defaults to false: New migrates.
	SkipMigrate bool

	// LockWait bounds how long a claim waits for a record that another
	// transaction holds locked: an uncommitted claim made with ClaimTx
	// (idem.Config.ClaimInTx), or a completion that is committing. The
	// claim asks for the row lock without waiting (NOWAIT) and asks again,
	// backing off, until LockWait has passed; it then answers
	// idemstore.ClaimInFlight (409). InnoDB's own lock wait counts in
	// whole seconds, too coarse for a duplicate request. At least a
	// millisecond. Defaults to 100 milliseconds.
	LockWait time.Duration

	// ReadFirst answers a duplicate (a replay, an in-flight key, another
	// payload) with a plain primary-key read, and inserts only when that
	// read finds no record it can answer from. Without it a claim inserts
	// first, which is all a new key costs, and a duplicate pays for the
	// failed insert and then the read. The read would cost every new key
	// a round trip, so the store reads first only while most of its
	// recent claims met a record; while most were of new keys, Claim and
	// ClaimTx insert first. Worth it where retries are common or replays
	// must cost one read; the answers are the same either way. Defaults
	// to false.
	ReadFirst bool
}

// Store is an idemstore.Store on MariaDB, shared by every instance of a
// service that uses the same database and table. It also implements
// idemstore.TxStore, idemstore.TxClaimer, idemstore.StepStore and
// idemstore.Inspector. Its methods are safe for concurrent use.
//
// Every lease and expiry decision uses the database's clock
// (UTC_TIMESTAMP(6)), never the Now in the parameters.
type Store struct {
	db        *sql.DB
	maxBody   int
	lockWait  time.Duration
	readFirst bool
	dups      dupscore.Tracker // with readFirst: what recent claims met
	tableName string
	table     string // quoted

	migrationList []migration
	latest        int

	sql sqlTexts
}

var (
	_ idemstore.Store     = (*Store)(nil)
	_ idemstore.TxStore   = (*Store)(nil)
	_ idemstore.TxClaimer = (*Store)(nil)
	_ idemstore.StepStore = (*Store)(nil)
	_ idemstore.Inspector = (*Store)(nil)
)

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

// New returns a Store on db, which the caller owns and closes after the
// Store's last use. db must come from github.com/go-sql-driver/mysql and
// reach MariaDB 10.6 or later; New refuses MySQL (see the package
// documentation). Unless cfg.SkipMigrate is set, New creates the records
// table, or migrates it to the current version; several instances may call
// it at the same time. New starts no goroutines.
func New(ctx context.Context, db *sql.DB, cfg *Config) (*Store, error) {
	s, err := build(db, cfg)
	if err != nil {
		return nil, err
	}
	if err := s.checkServer(ctx); err != nil {
		return nil, err
	}
	if cfg == nil || !cfg.SkipMigrate {
		if err := s.migrate(ctx); err != nil {
			return nil, fmt.Errorf("mysqlstore: migrate %s: %w", s.table, err)
		}
	}
	return s, nil
}

// build validates cfg and returns the Store, without touching the database.
func build(db *sql.DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("mysqlstore: nil *sql.DB")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if !identRE.MatchString(c.Table) {
		return nil, fmt.Errorf("mysqlstore: Table %q is not a valid name: use a-z, 0-9 and _, start with a letter or _, at most 48 bytes", c.Table)
	}
	if c.Table == migrationsTable {
		return nil, fmt.Errorf("mysqlstore: Table %q is reserved for the migration history", c.Table)
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.MaxResponseBytes < 0 {
		return nil, errors.New("mysqlstore: MaxResponseBytes is negative")
	}
	if c.LockWait == 0 {
		c.LockWait = DefaultLockWait
	}
	if c.LockWait < time.Millisecond {
		return nil, fmt.Errorf("mysqlstore: LockWait %v is shorter than a millisecond", c.LockWait)
	}
	s := &Store{db: db, maxBody: c.MaxResponseBytes, lockWait: c.LockWait, readFirst: c.ReadFirst, tableName: c.Table, table: quote(c.Table)}
	r := strings.NewReplacer(
		"{table}", s.table,
		"{fence_index}", quote(c.Table+"_fence"),
		"{expires_index}", quote(c.Table+"_expires_at"),
		"{lease_index}", quote(c.Table+"_lease_expires_at"),
		"{stuck_index}", quote(c.Table+"_stuck_lease"),
		"{state_check}", quote(c.Table+"_state"),
		"{lease_check}", quote(c.Table+"_lease"),
	)
	ms, err := loadMigrations(r)
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: %w", err)
	}
	s.migrationList, s.latest = ms, ms[len(ms)-1].version
	s.sql = newSQLTexts(s.table)
	return s, nil
}

// quote quotes an identifier that identRE accepted.
func quote(name string) string { return "`" + name + "`" }

// Table returns the records table's quoted name, for read-only operator
// tools that query it. Its columns are described by the store's
// migrations.
func (s *Store) Table() string { return s.table }

// DB returns the *sql.DB the Store was made with.
func (s *Store) DB() *sql.DB { return s.db }

// checkServer refuses servers this package is not tested on, and a
// max_allowed_packet too small for the largest response it stores.
func (s *Store) checkServer(ctx context.Context) error {
	var version string
	var packet int64
	if err := s.db.QueryRowContext(ctx, "SELECT VERSION(), @@max_allowed_packet").Scan(&version, &packet); err != nil {
		return fmt.Errorf("mysqlstore: read the server's version: %w", err)
	}
	if err := SupportedVersion(version); err != nil {
		return err
	}
	if need := int64(s.maxBody) + maxHeaderBytes + 4096; packet < need {
		return fmt.Errorf("mysqlstore: the server's max_allowed_packet is %d bytes; a %d-byte response needs %d: raise it or lower MaxResponseBytes", packet, s.maxBody, need)
	}
	return nil
}

// SupportedVersion returns nil if version (as SELECT VERSION() reports it)
// names a server the Store runs on: MariaDB 10.6 or later. MySQL is
// refused; the package documentation says why.
func SupportedVersion(version string) error {
	if !strings.Contains(version, "MariaDB") {
		return fmt.Errorf("mysqlstore: the server reports version %q, which is not MariaDB: this store runs on MariaDB 10.6 or later (it relies on SET STATEMENT, INSERT ... RETURNING and NOWAIT, which MySQL lacks or reports differently)", version)
	}
	major, minor, ok := parseVersion(version)
	if !ok {
		return fmt.Errorf("mysqlstore: cannot read the server's version %q", version)
	}
	if major < 10 || major == 10 && minor < 6 {
		return fmt.Errorf("mysqlstore: MariaDB %d.%d is too old: this store needs 10.6 or later (SKIP LOCKED)", major, minor)
	}
	return nil
}

// parseVersion reads "10.11.19-MariaDB-..." (or "5.5.5-10.11.19-MariaDB",
// as older clients were sent) into its major and minor numbers.
func parseVersion(v string) (major, minor int, ok bool) {
	v = strings.TrimPrefix(v, "5.5.5-")
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return 0, 0, false
	}
	major, err1 := strconv.Atoi(parts[0])
	minorText := parts[1]
	if i := strings.IndexFunc(minorText, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minorText = minorText[:i]
	}
	minor, err2 := strconv.Atoi(minorText)
	return major, minor, err1 == nil && err2 == nil
}

// micros converts a column to microseconds since the Unix epoch, read as
// UTC whatever the session's time zone: every time the store writes comes
// from UTC_TIMESTAMP(6).
func micros(col string) string {
	return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + col + ")"
}

const (
	now = "UTC_TIMESTAMP(6)"
	// epoch is the lease end of a record held for an operator.
	epoch = "'1970-01-01 00:00:00'"
)

// sqlTexts are the statements of a Store, for its table.
type sqlTexts struct {
	insertNew, insertKept, read, readLocked, deleteRow string
	renew, complete, release                           string
	saveCheckpoint, endLease, hold, stuck, held        string
	expiredBatch                                       string
}

func newSQLTexts(t string) sqlTexts {
	// An insert never waits for a lock: a row it collides with that
	// another transaction holds (an uncommitted ClaimTx, a completion
	// committing) fails it at once with ER_LOCK_WAIT_TIMEOUT, and the
	// claim backs off within Config.LockWait.
	insert := `SET STATEMENT innodb_lock_wait_timeout = 0 FOR
INSERT INTO ` + t + ` (scope, ` + "`key`" + `, fingerprint, token, lease_expires_at, expires_at, attempt, checkpoint)
VALUES (?, ?, ?, ?, ` + now + ` + INTERVAL ? MICROSECOND, %s, ?, ?)
RETURNING fence, ` + micros("lease_expires_at") + `, ` + micros("expires_at")
	cols := `fingerprint, token IS NOT NULL, IF(fingerprint = ?, response, NULL),
	` + micros("lease_expires_at") + `, COALESCE(lease_expires_at > ` + now + `, 0), ` + micros("expires_at") + `, expires_at > ` + now
	key := " WHERE scope = ? AND `key` = ?"
	owned := key + ` AND token = ? AND expires_at > ` + now
	stuck := `SELECT scope, ` + "`key`" + `, fingerprint, checkpoint, ` + micros("lease_expires_at") + ` FROM ` + t + `
WHERE token IS NOT NULL AND checkpoint IS NOT NULL AND expires_at > ` + now + ` AND `
	return sqlTexts{
		insertNew:  fmt.Sprintf(insert, now+" + INTERVAL ? MICROSECOND"),
		insertKept: fmt.Sprintf(insert, "TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00')"),
		read:       `SELECT ` + cols + ` FROM ` + t + key,
		readLocked: `SELECT ` + cols + `, attempt, checkpoint FROM ` + t + key + ` FOR UPDATE NOWAIT`,
		deleteRow:  `DELETE FROM ` + t + key,

		renew:          `UPDATE ` + t + ` SET lease_expires_at = ` + now + ` + INTERVAL ? MICROSECOND, rev = rev + 1` + owned,
		complete:       `UPDATE ` + t + ` SET response = ?, token = NULL, lease_expires_at = NULL, checkpoint = NULL, rev = rev + 1` + owned,
		release:        `DELETE FROM ` + t + owned,
		saveCheckpoint: `UPDATE ` + t + ` SET checkpoint = ?, rev = rev + 1` + owned,
		endLease:       `UPDATE ` + t + ` SET checkpoint = ?, lease_expires_at = ` + now + `, rev = rev + 1` + owned,
		hold:           `UPDATE ` + t + ` SET checkpoint = ?, lease_expires_at = ` + epoch + `, rev = rev + 1` + owned,
		// A held record's lease ended at the Unix epoch: the range (epoch,
		// now] skips the held records, and the epoch alone selects them.
		// stuck_lease is lease_expires_at for the records holding a
		// recovery point (migration 2), and its index serves both.
		stuck: stuck + `stuck_lease > ` + epoch + ` AND stuck_lease <= ` + now + ` ORDER BY stuck_lease LIMIT ?`,
		held:  stuck + `stuck_lease = ` + epoch + ` ORDER BY stuck_lease LIMIT ?`,
		// SKIP LOCKED leaves rows that a claim is replacing right now to
		// that claim, and never waits for them.
		expiredBatch: `SELECT scope, ` + "`key`" + ` FROM ` + t + ` WHERE expires_at <= ` + now + `
ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED`,
	}
}

// MariaDB error numbers the store acts on.
const (
	erDupEntry        = 1062
	erLockWaitTimeout = 1205 // also what NOWAIT and a zero innodb_lock_wait_timeout raise
	erLockDeadlock    = 1213
)

func errNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// errBusy reports that a claim met a row that another transaction holds,
// or lost a race for an insert: the claim backs off and runs again.
var errBusy = errors.New("record busy")

// busy turns the errors of a lost race into errBusy.
func busy(err error) error {
	switch errNumber(err) {
	case erDupEntry, erLockWaitTimeout, erLockDeadlock:
		return fmt.Errorf("%w: %w", errBusy, err)
	}
	return err
}

// queryer is what the claim needs from a *sql.DB or a *sql.Tx.
type queryer interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Claim implements idemstore.Store. A claim that creates a record is one
// INSERT that commits on its own, so a duplicate sees the record in flight
// at once; a duplicate is answered by a plain read after that INSERT fails.
// Expired and abandoned records are replaced in a short transaction that
// locks the row. It ignores p.Now.
func (s *Store) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	r, _, err := s.claim(ctx, p, false)
	return r, err
}

// ClaimTx implements idemstore.TxClaimer (idem.Config.ClaimInTx). A new key
// (or an expired record) is claimed inside a transaction that stays open
// for the operation's writes; the claim, the writes and the stored response
// then commit together. A concurrent claim of the same key meets the
// uncommitted row and answers idemstore.ClaimInFlight after at most
// Config.LockWait. A take-over of an abandoned record commits at once, as
// in Claim, and returns no transaction.
func (s *Store) ClaimTx(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, idemstore.Tx, error) {
	return s.claim(ctx, p, true)
}

func (s *Store) claim(ctx context.Context, p idemstore.ClaimParams, keepOpen bool) (idemstore.ClaimResult, idemstore.Tx, error) {
	if p.Lease <= 0 || p.TTL <= 0 {
		return idemstore.ClaimResult{}, nil, errors.New("mysqlstore: claim needs a positive lease and TTL")
	}
	if len(p.Scope) > maxScopeBytes || len(p.Key) > maxKeyBytes {
		return idemstore.ClaimResult{}, nil, fmt.Errorf("mysqlstore: claim: the scope is %d bytes and the key %d; the limits are %d and %d", len(p.Scope), len(p.Key), maxScopeBytes, maxKeyBytes)
	}
	deadline := time.Now().Add(s.lockWait)
	wait := time.Millisecond
	for first := true; ; first = false {
		r, tx, err := s.claimOnce(ctx, p, keepOpen, first)
		if !errors.Is(err, errBusy) {
			if err != nil {
				return idemstore.ClaimResult{}, nil, fmt.Errorf("mysqlstore: claim: %w", err)
			}
			return r, tx, nil
		}
		if time.Now().Add(wait).After(deadline) {
			return idemstore.ClaimResult{Outcome: idemstore.ClaimInFlight, Record: idemstore.Record{State: idemstore.StateInFlight, Fingerprint: p.Fingerprint}}, nil, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return idemstore.ClaimResult{}, nil, fmt.Errorf("mysqlstore: claim: %w", ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 16*time.Millisecond)
	}
}

// claimOnce makes one attempt. The first one inserts at once, which is all
// a new key costs (with ReadFirst, while most recent claims met a record,
// after a read that found nothing); when
// the key is taken it reads the record, and answers from it unless it must
// be replaced (expired) or taken over (its lease ended), which claimLocked
// does under the row's lock.
func (s *Store) claimOnce(ctx context.Context, p idemstore.ClaimParams, keepOpen, first bool) (idemstore.ClaimResult, idemstore.Tx, error) {
	readFirst := first && s.readFirst && !s.dups.MostlyNew()
	if first && !readFirst {
		r, tx, err := s.insertFirst(ctx, p, keepOpen)
		dup := errNumber(err) == erDupEntry
		if s.readFirst && (err == nil || dup) {
			s.dups.Record(dup)
		}
		if !dup {
			return r, tx, err
		}
	}
	cur, found, err := readRow(s.db.QueryRowContext(ctx, s.sql.read, p.Fingerprint, p.Scope, p.Key), false)
	if err != nil {
		return idemstore.ClaimResult{}, nil, err
	}
	if readFirst {
		s.dups.Record(found)
	}
	if found && cur.live {
		if r, ok, err := cur.answer(p); ok || err != nil {
			return r, nil, err
		}
	}
	if readFirst && !found {
		// Nothing there: insert at once. A duplicate key means another
		// claim inserted meanwhile; the next attempt reads it.
		r, tx, err := s.insertFirst(ctx, p, keepOpen)
		if errNumber(err) == erDupEntry {
			err = busy(err)
		}
		return r, tx, err
	}
	return s.claimLocked(ctx, p, keepOpen)
}

// insertFirst inserts a new record: in autocommit mode for Claim, in a new
// transaction left open for ClaimTx. A duplicate key comes back as
// MariaDB's error, for claimOnce to read the record.
func (s *Store) insertFirst(ctx context.Context, p idemstore.ClaimParams, keepOpen bool) (idemstore.ClaimResult, idemstore.Tx, error) {
	if !keepOpen {
		r, err := s.insert(ctx, s.db, p, nil)
		return r, nil, busyUnlessDup(err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return idemstore.ClaimResult{}, nil, err
	}
	r, err := s.insert(ctx, tx, p, nil)
	if err != nil {
		_ = tx.Rollback()
		return r, nil, busyUnlessDup(err)
	}
	return r, &storeTx{s: s, tx: tx}, nil
}

// busyUnlessDup is busy, except that a duplicate key stays MariaDB's
// error: on the first attempt it means "read the record".
func busyUnlessDup(err error) error {
	if errNumber(err) == erDupEntry {
		return err
	}
	return busy(err)
}

// insert writes an in-flight record owned by p.Token. kept, when set, is
// the record it replaces in a take-over: its retention, attempt count and
// checkpoint carry over.
func (s *Store) insert(ctx context.Context, db queryer, p idemstore.ClaimParams, kept *row) (idemstore.ClaimResult, error) {
	q, args := s.sql.insertNew, []any{p.Scope, p.Key, p.Fingerprint, p.Token, p.Lease.Microseconds(), p.TTL.Microseconds(), 1, nil}
	if kept != nil {
		q, args = s.sql.insertKept, []any{p.Scope, p.Key, p.Fingerprint, p.Token, p.Lease.Microseconds(), kept.expiresAt, kept.attempt + 1, kept.checkpoint}
	}
	var fence, lease, expires int64
	if err := db.QueryRowContext(ctx, q, args...).Scan(&fence, &lease, &expires); err != nil {
		return idemstore.ClaimResult{}, err
	}
	rec := idemstore.Record{State: idemstore.StateInFlight, Fingerprint: p.Fingerprint, Fence: fence,
		LeaseExpiresAt: fromMicros(lease), ExpiresAt: fromMicros(expires)}
	if kept != nil {
		rec.Checkpoint = kept.checkpoint
	}
	return idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, TookOver: kept != nil, Record: rec}, nil
}

// claimLocked decides under the row's lock, in a transaction: insert an
// absent key, replace an expired record, take over an abandoned one, or
// answer. Replacing deletes the row and inserts it again, so that the new
// owner draws a new fence from the AUTO_INCREMENT counter.
//
// With keepOpen, a claim that created a record (absent or expired before)
// returns its transaction uncommitted; a take-over commits.
func (s *Store) claimLocked(ctx context.Context, p idemstore.ClaimParams, keepOpen bool) (res idemstore.ClaimResult, open idemstore.Tx, err error) {
	// READ COMMITTED: the locking read of an absent key takes no gap lock,
	// so two claims of one new key race on the INSERT (one wins, the other
	// backs off) instead of deadlocking on each other's gap locks.
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return res, nil, err
	}
	defer func() {
		if open == nil {
			_ = rollback(ctx, tx)
		}
	}()
	cur, found, err := readRow(tx.QueryRowContext(ctx, s.sql.readLocked, p.Fingerprint, p.Scope, p.Key), true)
	if err != nil {
		return res, nil, busy(err)
	}
	var kept *row
	if found {
		if cur.live {
			if r, ok, err := cur.answer(p); ok || err != nil {
				return r, nil, err
			}
			kept = &cur // same fingerprint, in flight, lease ended
		}
		if _, err := tx.ExecContext(ctx, s.sql.deleteRow, p.Scope, p.Key); err != nil {
			return res, nil, busy(err)
		}
	}
	if res, err = s.insert(ctx, tx, p, kept); err != nil {
		return res, nil, busy(err)
	}
	if keepOpen && kept == nil {
		return res, &storeTx{s: s, tx: tx}, nil
	}
	if err := commit(ctx, tx); err != nil {
		return idemstore.ClaimResult{}, nil, busy(err)
	}
	return res, nil, nil
}

// row is a record as the claim reads it.
type row struct {
	fingerprint     string
	inFlight        bool
	response        []byte // only if the fingerprint matched
	leaseUntil      int64  // microseconds; 0 when completed
	leaseLive, live bool
	expiresAt       int64
	attempt         int
	checkpoint      []byte
}

func readRow(sr *sql.Row, locked bool) (row, bool, error) {
	var (
		r     row
		lease sql.NullInt64
	)
	dest := []any{&r.fingerprint, &r.inFlight, &r.response, &lease, &r.leaseLive, &r.expiresAt, &r.live}
	if locked {
		dest = append(dest, &r.attempt, &r.checkpoint)
	}
	err := sr.Scan(dest...)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	r.leaseUntil = lease.Int64
	return r, err == nil, err
}

// answer is the claim's outcome for a live record: ok is false when the
// record must be taken over (in flight, same fingerprint, lease ended).
func (r row) answer(p idemstore.ClaimParams) (idemstore.ClaimResult, bool, error) {
	rec := idemstore.Record{Fingerprint: r.fingerprint, ExpiresAt: fromMicros(r.expiresAt), State: idemstore.StateInFlight}
	if r.inFlight {
		rec.LeaseExpiresAt = fromMicros(r.leaseUntil)
	} else {
		rec.State = idemstore.StateCompleted
	}
	switch {
	case r.fingerprint != p.Fingerprint:
		return idemstore.ClaimResult{Outcome: idemstore.ClaimMismatch, Record: rec}, true, nil
	case !r.inFlight:
		resp := new(idemstore.Response)
		if err := resp.UnmarshalBinary(r.response); err != nil {
			return idemstore.ClaimResult{}, false, fmt.Errorf("stored response of (%q, %q): %w", p.Scope, p.Key, err)
		}
		rec.Response = resp
		return idemstore.ClaimResult{Outcome: idemstore.ClaimCompleted, Record: rec}, true, nil
	case r.leaseLive:
		return idemstore.ClaimResult{Outcome: idemstore.ClaimInFlight, Record: rec}, true, nil
	}
	return idemstore.ClaimResult{}, false, nil
}

func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }

// fenced runs a statement that changes only a record owned by the token,
// and turns "no such row" into idemstore.ErrLeaseLost.
func fenced(ctx context.Context, db queryer, op, q string, args ...any) error {
	res, err := db.ExecContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("mysqlstore: %s: %w", op, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("mysqlstore: %s: %w", op, err)
	}
	if n == 0 {
		return fmt.Errorf("mysqlstore: %s: %w", op, idemstore.ErrLeaseLost)
	}
	return nil
}

// Renew implements idemstore.Store. The new lease ends p.Lease after the
// database's current time; p.Now is ignored.
func (s *Store) Renew(ctx context.Context, p idemstore.RenewParams) error {
	if p.Lease <= 0 {
		return errors.New("mysqlstore: renew needs a positive lease")
	}
	return fenced(ctx, s.db, "renew", s.sql.renew, p.Lease.Microseconds(), p.Scope, p.Key, p.Token)
}

// Complete implements idemstore.Store.
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	return s.complete(ctx, s.db, p, "complete")
}

func (s *Store) complete(ctx context.Context, db queryer, p idemstore.CompleteParams, op string) error {
	if p.Response == nil {
		return fmt.Errorf("mysqlstore: %s needs a response", op)
	}
	if len(p.Response.Body) > s.maxBody || p.Response.EncodedSize()-len(p.Response.Body) > maxHeaderBytes {
		return fmt.Errorf("mysqlstore: %s: %d-byte body, limit %d: %w", op, len(p.Response.Body), s.maxBody, idemstore.ErrResponseTooLarge)
	}
	enc, err := p.Response.MarshalBinary()
	if err != nil {
		return fmt.Errorf("mysqlstore: %s: %w", op, err)
	}
	return fenced(ctx, db, op, s.sql.complete, enc, p.Scope, p.Key, p.Token)
}

// Release implements idemstore.Store.
func (s *Store) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	return fenced(ctx, s.db, "release", s.sql.release, p.Scope, p.Key, p.Token)
}

// SaveCheckpoint implements idemstore.StepStore. With p.EndLease the lease
// ends at the database's current time; p.Now is ignored.
func (s *Store) SaveCheckpoint(ctx context.Context, p idemstore.SaveCheckpointParams) error {
	return s.saveCheckpoint(ctx, s.db, p)
}

func (s *Store) saveCheckpoint(ctx context.Context, db queryer, p idemstore.SaveCheckpointParams) error {
	if len(p.Checkpoint) == 0 {
		return errors.New("mysqlstore: empty checkpoint")
	}
	q := s.sql.saveCheckpoint
	switch {
	case p.Hold:
		q = s.sql.hold
	case p.EndLease:
		q = s.sql.endLease
	}
	return fenced(ctx, db, "save checkpoint", q, p.Checkpoint, p.Scope, p.Key, p.Token)
}

// Stuck implements idemstore.StepStore, by the database's clock (p.Now is
// ignored), walking the index on the lease's end.
func (s *Store) Stuck(ctx context.Context, p idemstore.StuckParams) ([]idemstore.StuckRecord, error) {
	if p.Limit <= 0 {
		return nil, errors.New("mysqlstore: Stuck needs a positive limit")
	}
	q := s.sql.stuck
	if p.Held {
		q = s.sql.held
	}
	rows, err := s.db.QueryContext(ctx, q, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("mysqlstore: stuck: %w", err)
	}
	defer rows.Close()
	var out []idemstore.StuckRecord
	for rows.Next() {
		var r idemstore.StuckRecord
		var lease int64
		if err := rows.Scan(&r.Scope, &r.Key, &r.Fingerprint, &r.Checkpoint, &lease); err != nil {
			return nil, fmt.Errorf("mysqlstore: stuck: %w", err)
		}
		r.LeaseExpiresAt = fromMicros(lease)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("mysqlstore: stuck: %w", err)
	}
	return out, nil
}

// deleteChunk bounds the keys one DELETE statement names.
const deleteChunk = 500

// DeleteExpired implements idemstore.Store: in one short transaction, it
// locks at most p.Limit records whose retention ended by the database's
// current time, oldest first, skipping rows that a claim holds, and
// deletes them by primary key. Call it in a loop (a few thousand per call
// keeps each one short) until it returns fewer than p.Limit.
func (s *Store) DeleteExpired(ctx context.Context, p idemstore.DeleteExpiredParams) (int, error) {
	if p.Limit <= 0 {
		return 0, errors.New("mysqlstore: DeleteExpired needs a positive limit")
	}
	n, err := s.deleteExpired(ctx, p.Limit)
	if err != nil {
		return 0, fmt.Errorf("mysqlstore: delete expired: %w", err)
	}
	return n, nil
}

func (s *Store) deleteExpired(ctx context.Context, limit int) (deleted int, err error) {
	// READ COMMITTED: the range scan takes no gap locks, so claims of new
	// keys never wait for a cleanup.
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			_ = rollback(ctx, tx)
		}
	}()
	rows, err := tx.QueryContext(ctx, s.sql.expiredBatch, limit)
	if err != nil {
		return 0, err
	}
	var ids [][2][]byte
	for rows.Next() {
		var scope, key []byte
		if err := rows.Scan(&scope, &key); err != nil {
			rows.Close()
			return 0, err
		}
		ids = append(ids, [2][]byte{scope, key})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), deleteChunk)]
		ids = ids[len(chunk):]
		var b strings.Builder
		args := make([]any, 0, 2*len(chunk))
		b.WriteString("DELETE FROM " + s.table + " WHERE expires_at <= " + now + " AND (")
		for i, id := range chunk {
			if i > 0 {
				b.WriteString(" OR ")
			}
			b.WriteString("(scope = ? AND `key` = ?)")
			args = append(args, id[0], id[1])
		}
		b.WriteString(")")
		res, err := tx.ExecContext(ctx, b.String(), args...)
		if err != nil {
			return 0, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return 0, err
		}
		deleted += int(n)
	}
	if err := commit(ctx, tx); err != nil {
		return 0, err
	}
	return deleted, nil
}
