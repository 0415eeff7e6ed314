package pgstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/internal/dupscore"
	"github.com/idemhq/idem/pgstore/internal/pgdb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// Defaults of Config.
const (
	DefaultSchema           = "idem"
	DefaultTable            = "idempotency_records"
	DefaultMaxResponseBytes = 1 << 20
)

// maxHeaderBytes bounds the encoded status line and header fields stored
// with a response, on top of Config.MaxResponseBytes for the body.
const maxHeaderBytes = 64 << 10

// maxIDBytes bounds len(scope)+len(key). PostgreSQL refuses B-tree entries
// larger than about a third of a page (2,704 bytes); a clear error here is
// better than the index's.
const maxIDBytes = 2048

// claimAttempts bounds how often Claim re-runs its statement when the
// statement's snapshot missed a row that a concurrent claim committed.
const claimAttempts = 8

// Config configures a Store. A nil *Config means all defaults, and so does
// each zero field.
type Config struct {
	// Schema is the PostgreSQL schema holding the records table and its
	// migration history; New creates it if it does not exist. Letters
	// a-z, digits and underscores, starting with a letter or underscore, at
	// most 48 bytes. Defaults to "idem".
	Schema string

	// Table is the name of the records table in Schema, with the same
	// rules as Schema. Defaults to "idempotency_records".
	Table string

	// MaxResponseBytes is the largest response body Complete stores; above
	// it Complete returns idemstore.ErrResponseTooLarge and changes nothing (the
	// core then completes the record as unreplayable, so the operation is
	// still never run twice). The encoded status and header fields may add
	// at most 64 KiB. Keep it at least idem.Config.MaxResponseBody.
	// Defaults to 1 MiB, the middleware's default.
	MaxResponseBytes int

	// SkipMigrate makes New issue no statement at all: the schema must
	// already be at the version this package expects (migrated by an
	// earlier New, or by an operator from the files in migrations/).
	// Use it where the application's database user may not run DDL.
	// Defaults to false: New migrates.
	SkipMigrate bool

	// AsyncClaim commits a claim without waiting for its WAL flush
	// (synchronous_commit off for that one statement), saving one flush
	// per first execution. Duplicates still see the claim at once, and
	// the completion, which commits synchronously, flushes the claim with
	// it. What it gives up: if the PostgreSQL server itself crashes within
	// wal_writer_delay (200 ms by default) of a claim, the claim can be
	// lost, so a retry may run again an operation whose effects outside
	// this database already happened. Safe, and worth it, when the
	// operation's effects are written in this database through
	// Tx/CompleteTx: they commit synchronously, after the claim. Defaults
	// to false.
	AsyncClaim bool

	// ReadFirst answers a duplicate (a replay, an in-flight key, another
	// payload) with a plain primary-key SELECT, and runs the claim
	// statement only when that read finds no record it can answer from.
	// The claim statement answers duplicates too, in one round trip for
	// every request, but PostgreSQL plans and initialises its INSERT …
	// ON CONFLICT node even when nothing is inserted: about four times the
	// execution time of the SELECT. The read would cost every new key a
	// second round trip, so the store reads first only while most of its
	// recent claims met a record; while most were of new keys, Claim and
	// ClaimTx go straight to the statement that inserts (and a duplicate
	// it meets is read then). Worth it where retries are common or replays
	// must be as cheap as a read; the answers are the same either way.
	// Defaults to false.
	ReadFirst bool

	// ClaimTxWait bounds how long ClaimTx (idem.Config.ClaimInTx) waits
	// for another transaction's uncommitted claim of the same key: if
	// that transaction commits within it, the claim answers from what it
	// committed (a replay, usually); otherwise it answers
	// idemstore.ClaimInFlight (409), without holding a connection longer. It
	// is the claim statement's lock_timeout. At least a millisecond.
	// Defaults to 100 milliseconds.
	ClaimTxWait time.Duration
}

// DefaultClaimTxWait is Config.ClaimTxWait's default.
const DefaultClaimTxWait = 100 * time.Millisecond

// Store is an idemstore.Store on PostgreSQL, shared by every instance of a
// service that uses the same database, schema and table. It also implements
// idemstore.TxStore. Its methods are safe for concurrent use.
//
// Every lease and expiry decision uses the database's clock, never the Now
// in the parameters, so instances whose clocks disagree cannot take over
// each other's live leases.
type Store struct {
	// db runs the statements. Exactly one of pool (New) and sqlDB (NewDB)
	// is set: the database it is on, for what only one side can do (pgx
	// batches, *sql.Tx).
	db      pgdb.DB
	pool    *pgxpool.Pool
	sqlDB   *sql.DB
	maxBody int

	schemaName, tableName string
	// Quoted identifiers: schema, schema.table, schema.idem_migrations.
	schema, table, migrations string

	migrationList []migration
	latest        int
	// noAdvisoryLock makes migrations rely on idempotent DDL and retries
	// alone, as they must where advisory locks are missing (tests use it
	// to check that fallback on PostgreSQL).
	noAdvisoryLock bool

	claimSQL, renewSQL, completeSQL, releaseSQL, deleteExpiredSQL string
	// insertSQL is Claim's first statement while dups says that most
	// claims are of new keys (insertStatement with its lock wait bounded);
	// guardedInsertSQL (with the NOT EXISTS guard) is what it falls back
	// on when that wait ran out; claimSQL is the first statement otherwise.
	insertSQL, guardedInsertSQL string
	dups                        dupscore.Tracker
	// takeOverSQL is the claim statement that also replaces a record:
	// Claim runs it when claimSQL (newKeyStatement) did not answer.
	takeOverSQL string
	// readSQL is ReadFirst's read: the live record, its response only if
	// the fingerprint matches (as the claim statement's cur).
	readSQL                                                    string
	readFirst                                                  bool
	saveCheckpointSQL, endLeaseSQL, holdSQL, stuckSQL, heldSQL string
	asyncClaim                                                 bool
	// claimTxSQL is the claim statement of ClaimTx; claimTxNewSQL its
	// INSERT of a new key (claimtx.go); claimTxWait their lock_timeout,
	// as PostgreSQL reads it ("100ms"); completeCheckedSQL the completion
	// sent with COMMIT.
	claimTxSQL, claimTxNewSQL, claimTxWait, completeCheckedSQL string
}

var (
	_ idemstore.Store     = (*Store)(nil)
	_ idemstore.TxStore   = (*Store)(nil)
	_ idemstore.StepStore = (*Store)(nil)
	_ idemstore.TxClaimer = (*Store)(nil)
)

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}$`)

// New returns a Store on pool, which the caller owns and closes after the
// Store's last use. Unless cfg.SkipMigrate is set, New creates the schema
// and the records table, or migrates them to the current version; several
// instances may call it at the same time. New starts no goroutines.
func New(ctx context.Context, pool *pgxpool.Pool, cfg *Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgstore: nil pool")
	}
	s, skipMigrate, err := build(cfg)
	if err != nil {
		return nil, err
	}
	s.db, s.pool = pgdb.Pool{P: pool}, pool
	return s.start(ctx, skipMigrate)
}

// NewDB returns a Store on db, a database/sql DB opened with pgx's stdlib
// driver (github.com/jackc/pgx/v5/stdlib: sql.Open("pgx", url),
// stdlib.OpenDB or stdlib.OpenDBFromPool), as GORM, sqlx, bun and ent use
// it. The caller owns db and closes it after the Store's last use. The
// Store is the same as New's, and runs the same statements; the
// execution's transaction is a *sql.Tx (see SQLTx), so that business
// writes made through those libraries commit with the stored response.
//
// database/sql keeps two idle connections by default: size
// db.SetMaxIdleConns like db.SetMaxOpenConns, or most calls open a new
// connection. NewDB migrates as New does and starts no goroutines. It
// returns an error for a db of another driver, whose argument encoding
// the statements do not expect.
func NewDB(ctx context.Context, db *sql.DB, cfg *Config) (*Store, error) {
	if db == nil {
		return nil, errors.New("pgstore: nil *sql.DB")
	}
	if _, ok := db.Driver().(*stdlib.Driver); !ok {
		return nil, fmt.Errorf("pgstore: the *sql.DB's driver is a %T: open it with pgx's stdlib driver (github.com/jackc/pgx/v5/stdlib)", db.Driver())
	}
	s, skipMigrate, err := build(cfg)
	if err != nil {
		return nil, err
	}
	s.db, s.sqlDB = pgdb.SQL{D: db}, db
	return s.start(ctx, skipMigrate)
}

// start migrates, unless skipMigrate.
func (s *Store) start(ctx context.Context, skipMigrate bool) (*Store, error) {
	if !skipMigrate {
		if err := s.migrate(ctx); err != nil {
			return nil, fmt.Errorf("pgstore: migrate %s: %w", s.table, err)
		}
	}
	return s, nil
}

// build validates cfg and returns the Store, without a database.
func build(cfg *Config) (*Store, bool, error) {
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
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	for _, id := range []struct{ field, name string }{{"Schema", c.Schema}, {"Table", c.Table}} {
		if !identRE.MatchString(id.name) {
			return nil, false, fmt.Errorf("pgstore: %s %q is not a valid name: use a-z, 0-9 and _, start with a letter or _, at most 48 bytes", id.field, id.name)
		}
	}
	if c.Table == migrationsTable {
		return nil, false, fmt.Errorf("pgstore: Table %q is reserved for the migration history", c.Table)
	}
	if c.MaxResponseBytes < 0 {
		return nil, false, errors.New("pgstore: MaxResponseBytes is negative")
	}
	if c.ClaimTxWait == 0 {
		c.ClaimTxWait = DefaultClaimTxWait
	}
	if c.ClaimTxWait < time.Millisecond {
		return nil, false, fmt.Errorf("pgstore: ClaimTxWait %v is shorter than a millisecond", c.ClaimTxWait)
	}

	s := &Store{
		maxBody:     c.MaxResponseBytes,
		schemaName:  c.Schema,
		tableName:   c.Table,
		schema:      pgx.Identifier{c.Schema}.Sanitize(),
		table:       pgx.Identifier{c.Schema, c.Table}.Sanitize(),
		migrations:  pgx.Identifier{c.Schema, migrationsTable}.Sanitize(),
		asyncClaim:  c.AsyncClaim,
		readFirst:   c.ReadFirst,
		claimTxWait: fmt.Sprintf("%dms", c.ClaimTxWait.Milliseconds()),
	}
	r := strings.NewReplacer(
		"{schema}", s.schema,
		"{table}", s.table,
		"{expires_index}", pgx.Identifier{c.Table + "_expires_at_idx"}.Sanitize(),
		"{expires_brin_index}", pgx.Identifier{c.Table + "_expires_at_brin"}.Sanitize(),
		"{stuck_index}", pgx.Identifier{c.Table + "_stuck_idx"}.Sanitize(),
		"{inflight_index}", pgx.Identifier{c.Table + "_inflight_idx"}.Sanitize(),
		"{checkpoint_index}", pgx.Identifier{c.Table + "_checkpoint_idx"}.Sanitize(),
		"{fence_seq}", s.fenceSeq(),
		// The names PostgreSQL chose for version 1's two CHECK
		// constraints (dropped by version 6).
		"{check_state}", pgx.Identifier{c.Table + "_check"}.Sanitize(),
		"{check_lease}", pgx.Identifier{c.Table + "_check1"}.Sanitize(),
	)
	ms, err := loadMigrations(r)
	if err != nil {
		return nil, false, fmt.Errorf("pgstore: %w", err)
	}
	s.migrationList, s.latest = ms, ms[len(ms)-1].version
	s.prepareSQL()
	return s, c.SkipMigrate, nil
}

// Table returns the records table's quoted, schema-qualified name, for
// read-only operator tools (idem console) that query it. Its columns are
// described by the store's migrations.
func (s *Store) Table() string { return s.table }

// prepareSQL builds the statement texts for the configured table. Times are
// statement_timestamp(), the database's clock at the start of the
// statement: one reading per statement, so every comparison in it agrees,
// and current also inside a long transaction (CompleteTx), where now()
// would be the transaction's start.
func (s *Store) prepareSQL() {
	// With AsyncClaim the claim's own transaction (the statement) commits
	// with synchronous_commit off: set_config(..., true) lasts until the
	// end of the transaction, and the commit reads it. It is evaluated only
	// when the INSERT's row is produced, that is when the claim writes.
	asyncClaim := ""
	if s.asyncClaim {
		asyncClaim = `
	  AND set_config('synchronous_commit', 'off', true) = 'off'`
	}
	s.insertSQL = s.insertStatement(false, `
	WHERE set_config('lock_timeout', '`+insertLockWait+`', true) IS NOT NULL`+asyncClaim)
	s.guardedInsertSQL = s.insertStatement(true, asyncClaim)
	s.claimSQL = s.newKeyStatement(asyncClaim)
	s.takeOverSQL = s.claimStatement(asyncClaim)
	// ClaimTx's claim waits for another transaction's uncommitted claim
	// of the key at most lock_timeout ($7), set for the transaction before
	// the INSERT can wait. The claim's transaction commits synchronously,
	// with the operation's writes.
	s.claimTxSQL = s.claimStatement(`
	  AND set_config('lock_timeout', $7, true) IS NOT NULL`)
	s.claimTxNewSQL = s.claimTxNewStatement()
	s.prepareRest()
}

// claimTxNewStatement is ClaimTx's statement for a key that most likely
// has no record: an INSERT … ON CONFLICT DO NOTHING that returns a row
// only when it inserted, and that restores lock_timeout itself, so that a
// new key's claim is BEGIN and this one statement where claimTxSQL needs
// a third (restoreLockTimeout). p reads the transaction's lock_timeout
// before the source row's condition sets it to $7 (a CTE is scanned
// before the condition on its row is evaluated); RETURNING, which runs
// once the row is in, after any wait for a concurrent claim, sets it back.
// When nothing is inserted, lock_timeout stays $7, and claimTxOnce goes on
// with claimTxSQL and restoreLockTimeout in the same transaction.
//
// Against claimTxSQL's plan (cur, the DO UPDATE arbiter and the UNION), a
// new key's claim and completion cost PostgreSQL about a ninth less CPU
// (pgbench, docs/BENCHMARKS.md, issue 24 round 10).
func (s *Store) claimTxNewStatement() string {
	return `WITH p AS MATERIALIZED (SELECT current_setting('lock_timeout') AS prev)
	INSERT INTO ` + s.table + ` (scope, key, fingerprint, token, lease_expires_at, expires_at, attempt, fence)
	SELECT $1, $2, $3, $4, statement_timestamp() + $5::interval, statement_timestamp() + $6::interval, 1,
	       nextval('` + s.fenceSeq() + `'::regclass)
	FROM p WHERE set_config('lock_timeout', $7, true) IS NOT NULL
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING lease_expires_at, expires_at, fence, set_config('lock_timeout', (SELECT prev FROM p), true)`
}

// insertStatement is Claim's statement for a key that has no record: an
// INSERT … ON CONFLICT DO NOTHING, which returns a row only when it
// inserted. When the key has a record it writes nothing, and Claim reads
// the record in a second round trip. PostgreSQL spends about 10 % less on
// it, with the completion, than on newKeyStatement, which answers
// duplicates in the same round trip but starts up a plan of several nodes
// for every claim (pgstore/BENCHMARKS.md). Claim picks between the two by
// what its recent claims met (dupscore).
//
// ON CONFLICT waits when a transaction has changed the key's record and
// not committed yet (CompleteTx's, or a take-over in ClaimTx's): it must
// know whether that transaction's row survives before it decides, where
// the committed record already answers (409, as a rule). Two statements
// keep a duplicate from waiting on it:
//   - Claim's first one (guard false, extra setting lock_timeout to
//     insertLockWait for the statement) waits at most that long. A
//     duplicate rarely meets an uncommitted change (CompleteTx's lock
//     lasts until its commit), so the common claim pays no more than the
//     INSERT itself;
//   - the one Claim falls back on when that wait ran out (guard true)
//     inserts only WHERE NOT EXISTS a committed record of the key: only a
//     key that has none reaches ON CONFLICT, and waits, as the other
//     statements do, for a concurrent first claim. The guard costs
//     PostgreSQL a second probe of the primary key on every claim (about
//     19 µs of its CPU, pgbench), which is why it is not the first.
//
// extra is added to the condition under which the SELECT produces the row
// to insert (after the guard's WHERE when there is one); it starts with
// WHERE when there is no guard. nextval runs only when the INSERT is
// attempted, so a duplicate rarely uses up a fence number (a concurrent
// insert may: fences still grow per key, with gaps).
func (s *Store) insertStatement(guard bool, extra string) string {
	t := s.table
	cond := extra
	if guard {
		cond = `
	WHERE NOT EXISTS (SELECT 1 FROM ` + t + ` WHERE scope = $1 AND key = $2)` + extra
	}
	return `INSERT INTO ` + t + ` (scope, key, fingerprint, token, lease_expires_at, expires_at, attempt, fence)
	SELECT $1, $2, $3, $4, statement_timestamp() + $5::interval, statement_timestamp() + $6::interval, 1,
	       nextval('` + s.fenceSeq() + `'::regclass)` + cond + `
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING lease_expires_at, expires_at, fence`
}

// insertLockWait bounds how long Claim's first INSERT waits for a
// transaction that holds the key's record (lock_timeout, for that
// statement only): long enough for a commit under load, or for the
// relation extension lock PostgreSQL takes to grow the table (a wait of
// over 20 ms was seen on a loaded 2-core machine); after it, the guarded
// statement answers.
const insertLockWait = "50ms"

// newKeyStatement is Claim's first statement, with extra added to the
// condition under which it inserts (evaluated only when it writes). It
// inserts the record of a new key and answers from a live record, as
// claimStatement does, but never replaces a record: when the key's record
// has expired, or is in flight with the same fingerprint and an expired
// lease, it returns no row (or a row that answer does not accept) and
// Claim runs claimStatement, the take-over, next. That costs those rare
// claims a second round trip, and saves every first execution and every
// replay the part of the plan that replacing needs: ON CONFLICT DO
// NOTHING against DO UPDATE with its SET and WHERE, and cur's expiry
// filter. Callgrind of a backend (pgstore/BENCHMARKS.md): 311,000
// instructions per claim of a new key with claimStatement, 290,000 with
// this one.
//
// cur reads the key's record, expired or not; if there is one, the INSERT
// selects no row, so that nothing else than a take-over replaces it and
// the statement writes nothing. Otherwise the INSERT runs; a concurrent
// claim that inserted the key first makes it insert nothing (DO NOTHING
// neither locks that row nor writes), and as cur did not see that row
// either the statement returns no row: Claim then runs the take-over
// statement, whose new snapshot sees it.
func (s *Store) newKeyStatement(extra string) string {
	t := s.table
	return `WITH cur AS (` + curSelect(t) + `
), ins AS (
	INSERT INTO ` + t + ` (scope, key, fingerprint, token, lease_expires_at, expires_at, attempt, fence)
	SELECT $1, $2, $3, $4, statement_timestamp() + $5::interval, statement_timestamp() + $6::interval, 1,
	       nextval('` + s.fenceSeq() + `'::regclass)
	WHERE NOT EXISTS (SELECT 1 FROM cur)` + extra + `
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING lease_expires_at, expires_at, fence
)
SELECT true, 1, $3, false, NULL::bytea, ins.lease_expires_at, true, ins.expires_at, ins.fence, NULL::bytea FROM ins
UNION ALL
SELECT false, 0, cur.fingerprint, cur.completed, cur.response, cur.lease_expires_at, cur.lease_live, cur.expires_at, 0::bigint, NULL::bytea
FROM cur WHERE cur.expires_at > statement_timestamp() AND NOT EXISTS (SELECT 1 FROM ins)`
}

// claimStatement is the claim statement that also takes records over
// (ClaimTx's, and Claim's when newKeyStatement did not answer), with extra
// added to the condition under which it inserts (evaluated only when it
// writes).
func (s *Store) claimStatement(extra string) string {
	t := s.table
	// Claim is one statement and, in the normal case, one round trip.
	//
	// cur reads the live (unexpired) record. If it exists and must not be
	// replaced (another fingerprint, completed, or a live lease), the INSERT
	// selects no row: replays, 409s and 422s write nothing, take no row
	// lock and need no transaction ID, so they cost no WAL flush.
	//
	// Otherwise the INSERT runs, and ON CONFLICT ... WHERE is the arbiter:
	// PostgreSQL evaluates it against the latest committed version of the
	// row, under the row's lock, so of many concurrent claims exactly one
	// inserts or takes over; the others get no row from ins. A row is
	// replaced only if it has expired (then any fingerprint may claim it,
	// as for an absent key) or is in flight with the same fingerprint and
	// an expired lease (a take-over).
	//
	// A take-over keeps the record's retention (expires_at): it never
	// extends it; only a record that expired gets a new one.
	//
	// The final SELECT returns ins's row, or else cur's. When ins is empty
	// and cur does not explain why (cur saw no row, or saw a lease that had
	// expired), the row that blocked the INSERT was committed after the
	// statement's snapshot was taken: Claim runs the statement again, and
	// the new snapshot sees it. That costs a second round trip only in
	// that race.
	return `WITH cur AS (` + curSelect(t) + ` AND expires_at > statement_timestamp()
), ins AS (
	INSERT INTO ` + t + ` AS r (scope, key, fingerprint, token, lease_expires_at, expires_at, attempt, fence)
	SELECT $1, $2, $3, $4, statement_timestamp() + $5::interval, statement_timestamp() + $6::interval, 1,
	       nextval('` + s.fenceSeq() + `'::regclass)
	WHERE NOT EXISTS (
		SELECT 1 FROM cur
		WHERE cur.fingerprint <> $3 OR cur.completed OR cur.lease_live)` + extra + `
	ON CONFLICT (scope, key) DO UPDATE SET
		fingerprint = excluded.fingerprint,
		token = excluded.token,
		lease_expires_at = excluded.lease_expires_at,
		expires_at = CASE WHEN r.expires_at <= statement_timestamp() THEN excluded.expires_at ELSE r.expires_at END,
		response = NULL,
		attempt = CASE WHEN r.expires_at <= statement_timestamp() THEN 1 ELSE r.attempt + 1 END,
		fence = excluded.fence,
		checkpoint = CASE WHEN r.expires_at <= statement_timestamp() THEN NULL ELSE r.checkpoint END
	WHERE r.expires_at <= statement_timestamp()
	   OR (r.token IS NOT NULL AND r.fingerprint = excluded.fingerprint
	       AND r.lease_expires_at <= statement_timestamp())
	RETURNING attempt, lease_expires_at, expires_at, fence, checkpoint
)
SELECT true, ins.attempt, $3, false, NULL::bytea, ins.lease_expires_at, true, ins.expires_at, ins.fence, ins.checkpoint FROM ins
UNION ALL
SELECT false, 0, cur.fingerprint, cur.completed, cur.response, cur.lease_expires_at, cur.lease_live, cur.expires_at, 0::bigint, NULL::bytea
FROM cur WHERE NOT EXISTS (SELECT 1 FROM ins)`
}

// curSelect is the claim statements' read of the key's record ($1, $2),
// its response only if the fingerprint ($3) matches; the caller may add
// conditions with AND.
func curSelect(table string) string {
	return `
	SELECT fingerprint,
	       response IS NOT NULL AS completed,
	       CASE WHEN fingerprint = $3 THEN response END AS response,
	       lease_expires_at,
	       coalesce(lease_expires_at > statement_timestamp(), false) AS lease_live,
	       expires_at
	FROM ` + table + `
	WHERE scope = $1 AND key = $2`
}

func (s *Store) prepareRest() {
	t := s.table
	// The read of ReadFirst, and of Claim when the key's INSERT found a
	// record: expired records too (the last column tells), so that one
	// to replace goes straight to the take-over statement.
	s.readSQL = `SELECT fingerprint, response IS NOT NULL, CASE WHEN fingerprint = $3 THEN response END,
	       lease_expires_at, coalesce(lease_expires_at > statement_timestamp(), false), expires_at,
	       expires_at > statement_timestamp()
FROM ` + t + `
WHERE scope = $1 AND key = $2`

	// The owner's statements match on the token, which is set only while
	// the record is in flight, and on the retention: an expired record
	// behaves as absent even before DeleteExpired removes it.
	owned := ` WHERE scope = $1 AND key = $2 AND token = $3 AND expires_at > statement_timestamp()`
	s.renewSQL = `UPDATE ` + t + ` SET lease_expires_at = statement_timestamp() + $4::interval` + owned
	s.completeSQL = `UPDATE ` + t + ` SET response = $4, token = NULL, lease_expires_at = NULL, checkpoint = NULL` + owned
	// The completion of a ClaimTx transaction, sent in one round trip with
	// COMMIT: if the token does not own the record it fails (a division
	// by zero, SQLSTATE 22012), so that the COMMIT behind it cannot
	// commit.
	s.completeCheckedSQL = `WITH done AS (` + s.completeSQL + ` RETURNING 1)
SELECT 1 / (SELECT count(*) FROM done)`
	s.releaseSQL = `DELETE FROM ` + t + owned
	s.saveCheckpointSQL = `UPDATE ` + t + ` SET checkpoint = $4` + owned
	s.endLeaseSQL = `UPDATE ` + t + ` SET checkpoint = $4, lease_expires_at = statement_timestamp()` + owned
	// A held record's lease ended at the Unix epoch: the range (epoch,
	// now] skips the held records, and the epoch alone selects them.
	s.holdSQL = `UPDATE ` + t + ` SET checkpoint = $4, lease_expires_at = 'epoch'` + owned
	stuck := `SELECT scope, key, fingerprint, checkpoint, lease_expires_at FROM ` + t + `
	WHERE token IS NOT NULL AND checkpoint IS NOT NULL AND expires_at > statement_timestamp()
	  AND `
	s.stuckSQL = stuck + `lease_expires_at > 'epoch' AND lease_expires_at <= statement_timestamp()
	ORDER BY lease_expires_at LIMIT $1`
	s.heldSQL = stuck + `lease_expires_at = 'epoch'
	ORDER BY lease_expires_at LIMIT $1`

	// One short transaction per batch, reading the block ranges that the
	// expiry index (BRIN) says may hold expired rows, in the table's
	// order: with no ORDER BY the scan stops at the batch's size instead
	// of sorting every expired row first. SKIP
	// LOCKED leaves rows that a claim is replacing right now to that claim
	// and never waits for them. The row locks make the DELETE remove
	// exactly the rows batch chose: none can have been taken over in
	// between.
	//
	// The chosen keys go through arrays because of the planner: with
	// "(scope, key) IN (SELECT ...)" PostgreSQL 15 hash-joined the batch
	// against a sequential scan of the whole table (550 ms per batch of
	// 10,000 on a table of 1,000,000 rows). unnest is estimated at a few
	// rows whatever the batch size, so the DELETE probes the primary key
	// once per chosen row (65 ms for the same batch).
	s.deleteExpiredSQL = `WITH batch AS (
	SELECT scope, key FROM ` + t + `
	WHERE expires_at <= statement_timestamp()
	LIMIT $1
	FOR UPDATE SKIP LOCKED
), ids AS (
	SELECT array_agg(scope) AS scopes, array_agg(key) AS keys FROM batch
)
DELETE FROM ` + t + ` AS r
USING ids, unnest(ids.scopes, ids.keys) AS d(scope, key)
WHERE r.scope = d.scope AND r.key = d.key`
}

// Claim implements idemstore.Store. It commits in its own short transaction, so
// a duplicate sees the record in flight at once. It ignores p.Now.
func (s *Store) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	if err := checkClaim(p); err != nil {
		return idemstore.ClaimResult{}, err
	}
	q := s.claimSQL
	switch {
	case s.dups.MostlyNew():
		r, ok, err := s.insertOnce(ctx, p)
		if ok || err != nil {
			return r, err
		}
		// The key has a record: read it. A live one answers (a replay,
		// 409, 422); one to replace, or none (it was deleted since the
		// INSERT), goes to the take-over statement.
		r, ok, _, err = s.readOnce(ctx, p)
		if err != nil {
			return r, fmt.Errorf("pgstore: claim: %w", err)
		}
		if ok {
			return r, nil
		}
		q = s.takeOverSQL
	case s.readFirst:
		r, ok, found, err := s.readOnce(ctx, p)
		if err != nil {
			return r, fmt.Errorf("pgstore: claim: %w", err)
		}
		s.dups.Record(found)
		if ok {
			return r, nil
		}
		if found {
			// A record to replace: only the take-over statement can.
			q = s.takeOverSQL
			break
		}
		if r, ok, err := s.insertOnce(ctx, p); ok || err != nil {
			return r, err
		}
		q = s.takeOverSQL
	}
	for range claimAttempts {
		r, ok, err := s.claimOnce(ctx, q, p)
		if err != nil {
			// CockroachDB and YugabyteDB may abort the statement with a
			// serialization failure under contention; it changed nothing,
			// and running it again is safe.
			if sqlState(err) == "40001" && ctx.Err() == nil {
				continue
			}
			return idemstore.ClaimResult{}, fmt.Errorf("pgstore: claim: %w", err)
		}
		if ok {
			if q == s.claimSQL {
				s.dups.Record(r.Outcome != idemstore.ClaimAcquired)
			}
			return r, nil
		}
		// The record is to be replaced, or was committed after the
		// statement's snapshot: the take-over statement decides.
		q = s.takeOverSQL
	}
	return idemstore.ClaimResult{}, fmt.Errorf("pgstore: claim: the record kept changing during %d attempts", claimAttempts)
}

// insertOnce runs insertSQL, the claim of a key that has no record. ok
// reports that it inserted the record; otherwise the key has a record
// (or had one an instant ago), and nothing was written.
func (s *Store) insertOnce(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, bool, error) {
	for attempt := 1; ; attempt++ {
		var (
			leaseEnd, expiresAt time.Time
			fence               int64
		)
		q := s.insertSQL
		if attempt > 1 {
			q = s.guardedInsertSQL
		}
		err := s.db.QueryRow(ctx, q, p.Scope, p.Key, p.Fingerprint, p.Token, p.Lease, p.TTL).Scan(&leaseEnd, &expiresAt, &fence)
		switch {
		case pgdb.IsNoRows(err):
			s.dups.Record(true)
			return idemstore.ClaimResult{}, false, nil
		case err != nil:
			// 55P03 (lock_not_available): the wait ran out; 40001: a
			// serialization failure (CockroachDB, YugabyteDB). Either
			// statement changed nothing, and the guarded one runs next.
			if c := sqlState(err); (c == "55P03" || c == "40001") && ctx.Err() == nil && attempt < claimAttempts {
				continue
			}
			return idemstore.ClaimResult{}, false, fmt.Errorf("pgstore: claim: %w", err)
		}
		s.dups.Record(false)
		rec := idemstore.Record{Fingerprint: p.Fingerprint, ExpiresAt: expiresAt, LeaseExpiresAt: leaseEnd, State: idemstore.StateInFlight, Fence: fence}
		return idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: rec}, true, nil
	}
}

// checkClaim checks a claim's parameters.
func checkClaim(p idemstore.ClaimParams) error {
	if p.Lease <= 0 || p.TTL <= 0 {
		return errors.New("pgstore: claim needs a positive lease and TTL")
	}
	if len(p.Scope)+len(p.Key) > maxIDBytes {
		return fmt.Errorf("pgstore: claim: scope and key are %d bytes, the limit is %d", len(p.Scope)+len(p.Key), maxIDBytes)
	}
	return nil
}

// answerFirst is what ClaimTx does before its claim statement: check the
// parameters and, with ReadFirst, answer a duplicate from the read. ok
// reports that r is the answer; insert that the claim should start with
// the INSERT of a new key (claimTxNewSQL): most recent claims were new, or
// the read found no record.
func (s *Store) answerFirst(ctx context.Context, p idemstore.ClaimParams) (r idemstore.ClaimResult, ok, insert bool, err error) {
	if err := checkClaim(p); err != nil {
		return r, false, false, err
	}
	if s.dups.MostlyNew() {
		return r, false, true, nil
	}
	if !s.readFirst {
		return r, false, false, nil
	}
	r, ok, found, err := s.readOnce(ctx, p)
	if err != nil {
		return r, false, false, fmt.Errorf("pgstore: claim: %w", err)
	}
	s.dups.Record(found)
	return r, ok, !found, nil
}

// claimOnce runs the claim statement q once. ok is false when the
// statement did not decide: its snapshot missed a concurrent change, or
// (newKeyStatement) the record is to be replaced.
func (s *Store) claimOnce(ctx context.Context, q string, p idemstore.ClaimParams) (idemstore.ClaimResult, bool, error) {
	return claimResult(p, s.db.QueryRow(ctx, q, p.Scope, p.Key, p.Fingerprint, p.Token, p.Lease, p.TTL))
}

// claimResult reads the claim statement's row.
func claimResult(p idemstore.ClaimParams, row pgdb.Row) (res idemstore.ClaimResult, ok bool, err error) {
	var (
		acquired, completed, leaseLive bool
		attempt                        int32
		fingerprint                    string
		body                           []byte
		leaseEnd                       *time.Time
		expiresAt                      time.Time
		fence                          int64
		checkpoint                     []byte
	)
	err = row.Scan(&acquired, &attempt, &fingerprint, &completed, &body, &leaseEnd, &leaseLive, &expiresAt, &fence, &checkpoint)
	if pgdb.IsNoRows(err) {
		return res, false, nil
	}
	if err != nil {
		return res, false, err
	}
	if acquired {
		rec := idemstore.Record{Fingerprint: fingerprint, ExpiresAt: expiresAt, State: idemstore.StateInFlight, Fence: fence, Checkpoint: checkpoint}
		if leaseEnd != nil {
			rec.LeaseExpiresAt = *leaseEnd
		}
		return idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, TookOver: attempt > 1, Record: rec}, true, nil
	}
	// Same fingerprint, in flight, lease expired, when answer says not
	// ok: the INSERT ran, and a newer row version than the snapshot's
	// refused it.
	return answer(p, fingerprint, completed, body, leaseEnd, leaseLive, expiresAt)
}

// readOnce reads the key's record: ok when it answers the claim without
// a write (live and completed, another fingerprint, or a live lease), as
// the claim statement would answer from the same row; found when there
// is a record, answering or not (expired, or in flight with an expired
// lease: a take-over's).
func (s *Store) readOnce(ctx context.Context, p idemstore.ClaimParams) (res idemstore.ClaimResult, ok, found bool, err error) {
	var (
		completed, leaseLive, live bool
		fingerprint                string
		body                       []byte
		leaseEnd                   *time.Time
		expiresAt                  time.Time
	)
	err = s.db.QueryRow(ctx, s.readSQL, p.Scope, p.Key, p.Fingerprint).
		Scan(&fingerprint, &completed, &body, &leaseEnd, &leaseLive, &expiresAt, &live)
	if pgdb.IsNoRows(err) {
		return res, false, false, nil
	}
	if err != nil {
		return res, false, false, err
	}
	if !live {
		return res, false, true, nil
	}
	res, ok, err = answer(p, fingerprint, completed, body, leaseEnd, leaseLive, expiresAt)
	return res, ok, true, err
}

// answer is the claim's outcome for a live record that was not acquired:
// ok is false when the record does not explain why (in flight with the
// same fingerprint and an expired lease), and the claim must run (again).
func answer(p idemstore.ClaimParams, fingerprint string, completed bool, body []byte, leaseEnd *time.Time, leaseLive bool, expiresAt time.Time) (idemstore.ClaimResult, bool, error) {
	rec := idemstore.Record{Fingerprint: fingerprint, ExpiresAt: expiresAt, State: idemstore.StateInFlight}
	if leaseEnd != nil {
		rec.LeaseExpiresAt = *leaseEnd
	}
	if completed {
		rec.State = idemstore.StateCompleted
	}
	switch {
	case fingerprint != p.Fingerprint:
		return idemstore.ClaimResult{Outcome: idemstore.ClaimMismatch, Record: rec}, true, nil
	case completed:
		resp := new(idemstore.Response)
		// body was copied out of the connection's buffer by Scan, so the
		// decoded response may alias it.
		if err := resp.UnmarshalBinary(body); err != nil {
			return idemstore.ClaimResult{}, false, fmt.Errorf("stored response of (%q, %q): %w", p.Scope, p.Key, err)
		}
		rec.Response = resp
		return idemstore.ClaimResult{Outcome: idemstore.ClaimCompleted, Record: rec}, true, nil
	case leaseLive:
		return idemstore.ClaimResult{Outcome: idemstore.ClaimInFlight, Record: rec}, true, nil
	}
	return idemstore.ClaimResult{}, false, nil
}

// Renew implements idemstore.Store. The new lease ends p.Lease after the
// database's current time; p.Now is ignored.
func (s *Store) Renew(ctx context.Context, p idemstore.RenewParams) error {
	if p.Lease <= 0 {
		return errors.New("pgstore: renew needs a positive lease")
	}
	n, err := s.db.Exec(ctx, s.renewSQL, p.Scope, p.Key, p.Token, p.Lease)
	if err != nil {
		return fmt.Errorf("pgstore: renew: %w", err)
	}
	if n == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// Complete implements idemstore.Store.
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	return s.complete(ctx, s.db, p, "complete")
}

func (s *Store) complete(ctx context.Context, db pgdb.Querier, p idemstore.CompleteParams, op string) error {
	enc, err := s.encodeResponse(p, op)
	if err != nil {
		return err
	}
	n, err := db.Exec(ctx, s.completeSQL, p.Scope, p.Key, p.Token, enc)
	if err != nil {
		return fmt.Errorf("pgstore: %s: %w", op, err)
	}
	if n == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// encodeResponse returns p's response as stored, or why it cannot be.
func (s *Store) encodeResponse(p idemstore.CompleteParams, op string) ([]byte, error) {
	if p.Response == nil {
		return nil, fmt.Errorf("pgstore: %s needs a response", op)
	}
	if len(p.Response.Body) > s.maxBody || p.Response.EncodedSize()-len(p.Response.Body) > maxHeaderBytes {
		return nil, fmt.Errorf("pgstore: %s: %d-byte body, limit %d: %w", op, len(p.Response.Body), s.maxBody, idemstore.ErrResponseTooLarge)
	}
	enc, err := p.Response.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("pgstore: %s: %w", op, err)
	}
	return enc, nil
}

// Release implements idemstore.Store.
func (s *Store) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	n, err := s.db.Exec(ctx, s.releaseSQL, p.Scope, p.Key, p.Token)
	if err != nil {
		return fmt.Errorf("pgstore: release: %w", err)
	}
	if n == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// DeleteExpired implements idemstore.Store: one statement deleting at most
// p.Limit records whose retention ended by the database's current time. Each call is a short transaction of its own; call it in a
// loop (a few thousand per call keeps each one short) until it returns
// fewer than p.Limit. Records a concurrent claim is replacing are skipped,
// not waited for.
func (s *Store) DeleteExpired(ctx context.Context, p idemstore.DeleteExpiredParams) (int, error) {
	if p.Limit <= 0 {
		return 0, errors.New("pgstore: DeleteExpired needs a positive limit")
	}
	n, err := s.db.Exec(ctx, s.deleteExpiredSQL, p.Limit)
	if err != nil {
		return 0, fmt.Errorf("pgstore: delete expired: %w", err)
	}
	return int(n), nil
}

// fenceSeq is the quoted name of the sequence fences are drawn from.
func (s *Store) fenceSeq() string {
	return pgx.Identifier{s.schemaName, s.tableName + "_fence_seq"}.Sanitize()
}

// SaveCheckpoint implements idemstore.StepStore. With p.EndLease the lease ends
// at the database's current time; p.Now is ignored.
func (s *Store) SaveCheckpoint(ctx context.Context, p idemstore.SaveCheckpointParams) error {
	return s.saveCheckpoint(ctx, s.db, p)
}

// SaveCheckpointTx is SaveCheckpoint inside the caller's transaction tx on
// the Store's database: a step's business writes and its recovery point
// commit together. It returns idemstore.ErrLeaseLost when the token no longer
// owns the record; the caller must then roll back. As with CompleteTx, call
// it last, just before Commit: from then on tx holds the record's row lock.
func (s *Store) SaveCheckpointTx(ctx context.Context, tx pgx.Tx, p idemstore.SaveCheckpointParams) error {
	if tx == nil {
		return errors.New("pgstore: save checkpoint in transaction: nil transaction")
	}
	return s.saveCheckpoint(ctx, pgdb.PgxTx{T: tx}, p)
}

// SaveCheckpointSQLTx is SaveCheckpointTx for a *sql.Tx of a Store made
// by NewDB.
func (s *Store) SaveCheckpointSQLTx(ctx context.Context, tx *sql.Tx, p idemstore.SaveCheckpointParams) error {
	if tx == nil {
		return errors.New("pgstore: save checkpoint in transaction: nil transaction")
	}
	return s.saveCheckpoint(ctx, &pgdb.SQLTx{T: tx}, p)
}

func (s *Store) saveCheckpoint(ctx context.Context, db pgdb.Querier, p idemstore.SaveCheckpointParams) error {
	if len(p.Checkpoint) == 0 {
		return errors.New("pgstore: empty checkpoint")
	}
	q := s.saveCheckpointSQL
	switch {
	case p.Hold:
		q = s.holdSQL
	case p.EndLease:
		q = s.endLeaseSQL
	}
	n, err := db.Exec(ctx, q, p.Scope, p.Key, p.Token, p.Checkpoint)
	if err != nil {
		return fmt.Errorf("pgstore: save checkpoint: %w", err)
	}
	if n == 0 {
		return idemstore.ErrLeaseLost
	}
	return nil
}

// Stuck implements idemstore.StepStore, by the database's clock (p.Now is
// ignored): it reads the partial index of the records holding a recovery
// point (migration 5) and returns them in the order of their leases' ends.
func (s *Store) Stuck(ctx context.Context, p idemstore.StuckParams) ([]idemstore.StuckRecord, error) {
	if p.Limit <= 0 {
		return nil, errors.New("pgstore: Stuck needs a positive limit")
	}
	q := s.stuckSQL
	if p.Held {
		q = s.heldSQL
	}
	rows, err := s.db.Query(ctx, q, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: stuck: %w", err)
	}
	defer rows.Close()
	var out []idemstore.StuckRecord
	for rows.Next() {
		var r idemstore.StuckRecord
		if err := rows.Scan(&r.Scope, &r.Key, &r.Fingerprint, &r.Checkpoint, &r.LeaseExpiresAt); err != nil {
			return nil, fmt.Errorf("pgstore: stuck: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgstore: stuck: %w", err)
	}
	return out, nil
}

// sqlState returns the SQLSTATE of a PostgreSQL error, or "".
func sqlState(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
