// Package sqlitestore is the embedded idemstore.Store: idempotency records in a
// SQLite file, with nothing to install (modernc.org/sqlite, no cgo).
//
// It is correct for many goroutines in one process and for several
// processes sharing one file on one machine. It implements idemstore.TxStore:
// the handler's business writes, the owner-token check, the record's
// completion and the stored response commit in one SQLite transaction, so
// after a crash either both exist or neither.
//
// # Connections and locks
//
// Open keeps two pools on the file: a writer with a single connection whose
// transactions are BEGIN IMMEDIATE (SQLite allows one writer at a time; a
// single connection removes SQLITE_BUSY between this process's own
// goroutines and measured faster than several), and a pool of read-only
// connections. The database runs in WAL mode with synchronous=NORMAL and a
// busy timeout for the writers of other processes.
//
// Claims read first: duplicates of completed or running requests (replays,
// 409, 422) are answered by a read that never waits for the write lock.
// Only a claim that creates or takes over a record writes, in its own short
// transaction, committed before the handler runs.
//
// The transaction handed to a handler (Tx) is begun lazily, when the
// handler first asks for it, and holds the write lock until the response is
// stored. Do slow non-database work (calls to other services) before
// asking for the transaction: while it is open, other writers in this
// process queue for the connection and those of other processes wait up to
// the busy timeout. Lease renewal does not starve: while the transaction is
// open the core renews through it.
//
// It also implements idemstore.StepStore: a multi-step operation's step (see
// idem.Step) commits its writes and its recovery point in one transaction,
// fenced by the owner token, and claims carry a fencing token drawn from a
// one-row counter that only grows (in blocks: see fenceBlock).
//
// Records expire at their retention time and then behave as absent;
// DeleteExpired removes them in bounded batches when the application (or
// `idem cleanup`) calls it. The store starts no goroutines.
package sqlitestore

import (
	"context"
	"crypto/rand"
	"database/sql"
	"embed"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/internal/dupscore"
	"modernc.org/sqlite" // registers the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"
)

// Defaults of Config.
const (
	DefaultTable            = "idem_records"
	DefaultBusyTimeout      = 5 * time.Second
	DefaultMaxResponseBytes = 16 << 20
)

// Config configures a Store. A nil *Config means all defaults.
type Config struct {
	// Table names the records table. It must be a plain SQL identifier.
	// Defaults to "idem_records".
	Table string

	// BusyTimeout is how long a writer waits for another process's write
	// lock before failing with SQLITE_BUSY. Defaults to 5 seconds.
	BusyTimeout time.Duration

	// MaxResponseBytes bounds the encoded size of a stored response;
	// Complete returns idemstore.ErrResponseTooLarge above it, and the core
	// completes the record without a body instead. Defaults to 16 MiB,
	// above the middleware's own default limit.
	MaxResponseBytes int

	// ReadConns is the size of the read-only connection pool. Defaults to
	// four per CPU.
	ReadConns int
}

// Store is an idemstore.Store and idemstore.TxStore on a SQLite file.
type Store struct {
	writer *sql.DB
	reader *sql.DB
	table  string
	maxLen int
	sql    sqlTexts
	st     statements
	fences fenceBlock
	// mix estimates whether recent ClaimTx calls met new keys or existing
	// records, so that ClaimTx can skip the read that answers duplicates
	// without the write lock while most claims are of new keys (idem
	// serve's first payments): that read finds nothing for a new key, and
	// the claim's transaction reads the key again under the write lock
	// anyway. Both ways answer every claim correctly; a wrong guess costs a
	// read, or a duplicate's wait for the write lock, never an answer.
	mix dupscore.Tracker
}

// fenceBlock is the block of fences a Store reserved: [next, limit].
//
// The counter row ({table}_fence) holds n, the greatest fence drawn from
// the file, and owner: 0, or the Store holding the block that ends at n.
// While the row names this Store's block, every fence drawn since the
// reservation came from it, in order, so its next fence is greater than
// all of them, and a claim writes nothing for its fence. The row is then
// written once per fenceBlockSize claims instead of by every claim (a page
// per first execution).
//
// A Store reserves a block only after fenceSoloClaims claims in a row found
// the counter as it left it (no other process or Store on the file drew a
// fence in between); until then each claim advances the counter in its own
// transaction, as it always did. A claim that finds another Store's block
// first ends that block durably, in a transaction of its own, before it
// draws a fence: otherwise, if the claim rolled back, the other Store
// would go on handing out fences below the one this claim used.
type fenceBlock struct {
	mu          sync.Mutex
	owner       int64 // random, never 0 (the column's default)
	next, limit int64
	wrote       int64 // n as this Store last wrote it
	streak      int   // claims in a row that found n == wrote
}

const (
	// fenceBlockSize is how many fences a reservation takes. A block not
	// used up (the process stops) leaves a gap: fences only need to grow.
	fenceBlockSize = 1024
	// fenceSoloClaims is how many claims in a row must find the counter
	// untouched by others before a Store reserves a block.
	fenceSoloClaims = 16
)

// errFenceBlockHeld reports that another Store holds a block of fences.
type errFenceBlockHeld struct{ owner int64 }

func (e errFenceBlockHeld) Error() string { return "another store holds a block of fences" }

// nextFence draws the next fence in tx, which holds the write lock, and
// returns the expiry of the record of (scope, key), if there is one.
func (s *Store) nextFence(ctx context.Context, tx *sql.Tx, scope, key string) (fence int64, expiresAt sql.NullInt64, err error) {
	f := &s.fences
	f.mu.Lock()
	defer f.mu.Unlock()
	var n, owner int64
	if err := tx.StmtContext(ctx, s.st.readFence).QueryRowContext(ctx, scope, key).Scan(&n, &owner, &expiresAt); err != nil {
		return 0, expiresAt, err
	}
	switch {
	case owner == f.owner && n == f.limit && f.next <= f.limit:
		fence := f.next
		f.next++
		return fence, expiresAt, nil
	case owner != 0 && owner != f.owner:
		return 0, expiresAt, errFenceBlockHeld{owner: owner}
	}
	// A reservation whose transaction rolled back left the row as it was:
	// it no longer names the block, and the claim lands here.
	if n == f.wrote {
		f.streak++
	} else {
		f.streak = 0
	}
	size, holder := int64(1), int64(0)
	if f.streak >= fenceSoloClaims {
		size, holder = fenceBlockSize, f.owner
	}
	if err := tx.StmtContext(ctx, s.st.reserveFences).QueryRowContext(ctx, size, holder).Scan(&n); err != nil {
		return 0, expiresAt, err
	}
	f.wrote = n
	f.next, f.limit = n-size+2, n
	return n - size + 1, expiresAt, nil
}

var (
	_ idemstore.Store     = (*Store)(nil)
	_ idemstore.TxStore   = (*Store)(nil)
	_ idemstore.Tx        = (*storeTx)(nil)
	_ idemstore.TxRenewer = (*storeTx)(nil)

	_ idemstore.StepStore    = (*Store)(nil)
	_ idemstore.TxClaimer    = (*Store)(nil)
	_ idemstore.CheckpointTx = (*storeTx)(nil)
)

//go:embed migrations/*.sql
var migrations embed.FS

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// Open opens (creating it if needed) the SQLite database at path and
// migrates the store's schema. The Store owns its connections; Close them
// with Close.
func Open(ctx context.Context, path string, cfg *Config) (*Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if !identifier.MatchString(c.Table) {
		return nil, fmt.Errorf("sqlitestore: table name %q is not a plain identifier", c.Table)
	}
	if c.BusyTimeout == 0 {
		c.BusyTimeout = DefaultBusyTimeout
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.ReadConns == 0 {
		c.ReadConns = 4 * runtime.NumCPU()
	}
	if c.BusyTimeout < 0 || c.MaxResponseBytes < 0 || c.ReadConns < 0 {
		return nil, errors.New("sqlitestore: negative Config value")
	}
	if path == "" || strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("sqlitestore: unusable database path %q", path)
	}
	if path == ":memory:" {
		return nil, errors.New("sqlitestore: an in-memory database cannot be shared by the store's connections; use a file (or memstore)")
	}

	busy := strconv.FormatInt(c.BusyTimeout.Milliseconds(), 10)
	common := "file:" + path + "?_pragma=busy_timeout(" + busy + ")&_pragma=foreign_keys(1)"
	writer, err := sql.Open("sqlite", common+"&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	writer.SetMaxOpenConns(1)
	writer.SetMaxIdleConns(1)
	writer.SetConnMaxLifetime(0)
	writer.SetConnMaxIdleTime(0)

	s := &Store{writer: writer, table: c.Table, maxLen: c.MaxResponseBytes, sql: newSQLTexts(c.Table)}
	var owner [8]byte
	for s.fences.owner == 0 {
		_, _ = rand.Read(owner[:])
		s.fences.owner = int64(binary.LittleEndian.Uint64(owner[:]))
	}
	if err := s.migrateRetrying(ctx, c.BusyTimeout); err != nil {
		writer.Close()
		return nil, err
	}
	// The reader opens after the writer created the file and switched it
	// to WAL, which is a property of the file.
	reader, err := sql.Open("sqlite", common+"&_pragma=query_only(1)")
	if err != nil {
		writer.Close()
		return nil, fmt.Errorf("sqlitestore: open %s: %w", path, err)
	}
	reader.SetMaxOpenConns(c.ReadConns)
	reader.SetMaxIdleConns(c.ReadConns)
	s.reader = reader
	if err := s.prepare(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("sqlitestore: prepare: %w", err)
	}
	return s, nil
}

// Close closes the store's statements and connections.
func (s *Store) Close() error {
	errs := []error{}
	for _, st := range s.st.all() {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(append(errs, s.reader.Close(), s.writer.Close())...)
}

// DB returns the store's writer: the single read-write connection pool of
// the file, for the application's own schema and writes outside an
// idempotent execution. Writes through it queue behind the store's.
func (s *Store) DB() *sql.DB { return s.writer }

// ReadDB returns the store's pool of read-only connections, for the
// application's queries: WAL readers never wait for the write lock.
func (s *Store) ReadDB() *sql.DB { return s.reader }

// Table returns the name of the records table, for read-only operator
// tools (idem console) that query it through ReadDB. Its columns are
// described by the store's migrations.
func (s *Store) Table() string { return s.table }

// migrateRetrying runs migrate until it succeeds, fails for a reason other
// than SQLITE_BUSY, or the busy timeout has passed. Switching a new file to
// WAL takes an exclusive lock for which SQLite does not always call the busy
// handler, so processes that open one new file at the same moment can see
// SQLITE_BUSY at once; the retry makes that race harmless.
func (s *Store) migrateRetrying(ctx context.Context, budget time.Duration) error {
	deadline := time.Now().Add(budget)
	wait := time.Millisecond
	for {
		err := s.migrate(ctx)
		if err == nil || !isBusy(err) || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("sqlitestore: migrate: %w", ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
}

// isBusy reports whether err is SQLite's SQLITE_BUSY (any extended code).
func isBusy(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_BUSY
}

// migrate applies the embedded migrations that the file has not seen, in
// one immediate transaction, so concurrent processes migrate once.
func (s *Store) migrate(ctx context.Context) error {
	tx, err := s.writer.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	defer tx.Rollback()
	versionTable := s.table + "_schema"
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+versionTable+` (version INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	var current int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM `+versionTable).Scan(&current); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	slices.Sort(files)
	for _, f := range files {
		name := strings.TrimPrefix(f, "migrations/")
		v, err := strconv.Atoi(name[:strings.IndexByte(name, '_')])
		if err != nil {
			return fmt.Errorf("sqlitestore: migration %s: bad name", name)
		}
		if v <= current {
			continue
		}
		body, err := migrations.ReadFile(f)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, strings.ReplaceAll(string(body), "{{table}}", s.table)); err != nil {
			return fmt.Errorf("sqlitestore: migration %s: %w", name, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+versionTable+` (version) VALUES (?)`, v); err != nil {
			return fmt.Errorf("sqlitestore: migration %s: %w", name, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: migrate: %w", err)
	}
	return nil
}

const (
	stateInFlight  = 1
	stateCompleted = 2
)

// statements are prepared once: parsing the SQL on every call was over a
// third of a replay's claim. database/sql keeps each prepared per
// connection, and the writer has only one.
type statements struct {
	get, getRead, claim, takeOver, renew, complete, release, deleteExpired *sql.Stmt
	readFence, reserveFences, endFenceBlock, saveCheckpoint, endLease      *sql.Stmt
	stuck, put                                                             *sql.Stmt
}

func (st *statements) all() []*sql.Stmt {
	return []*sql.Stmt{st.get, st.getRead, st.claim, st.takeOver, st.renew, st.complete, st.release, st.deleteExpired,
		st.readFence, st.reserveFences, st.endFenceBlock, st.saveCheckpoint, st.endLease, st.stuck, st.put}
}

// sqlTexts are the statements of a Store, for its table.
type sqlTexts struct {
	get, claim, takeOver, renew, complete, release, deleteExpired     string
	readFence, reserveFences, endFenceBlock, saveCheckpoint, endLease string
	stuck, put                                                        string
}

func newSQLTexts(t string) sqlTexts {
	return sqlTexts{
		get: `SELECT fingerprint, state, lease_until, expires_at, response FROM ` + t + ` WHERE scope = ? AND key = ?`,
		// Inserts a new record, or replaces one that has expired; changes
		// nothing if a live record is there.
		// The fence is the one nextFence drew in the same transaction.
		claim: `INSERT INTO ` + t + ` (scope, key, fingerprint, state, token, lease_until, expires_at, response, fence, checkpoint)
			VALUES (?, ?, ?, 1, ?, ?, ?, NULL, ?, NULL)
			ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint, state = 1, token = excluded.token,
				lease_until = excluded.lease_until, expires_at = excluded.expires_at, response = NULL,
				fence = excluded.fence, checkpoint = NULL
			WHERE ` + t + `.expires_at <= ?`,
		// Writes a ClaimTx claim's record (pendingClaim) in the given
		// state, replacing an expired record as claim does.
		put: `INSERT INTO ` + t + ` (scope, key, fingerprint, state, token, lease_until, expires_at, response, fence, checkpoint)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)
			ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint, state = excluded.state, token = excluded.token,
				lease_until = excluded.lease_until, expires_at = excluded.expires_at, response = excluded.response,
				fence = excluded.fence, checkpoint = NULL
			WHERE ` + t + `.expires_at <= ?`,
		// A take-over keeps the record's retention: it never extends it.
		takeOver: `UPDATE ` + t + ` SET token = ?, lease_until = ?, fence = ?
			WHERE scope = ? AND key = ? AND state = 1 AND fingerprint = ? AND lease_until <= ? AND expires_at > ?
			RETURNING checkpoint, expires_at`,
		// The counter row, and the expiry of the claimed key's record, if
		// any, in one statement (a claim needs both under the write lock).
		readFence:     `SELECT n, owner, (SELECT expires_at FROM ` + t + ` WHERE scope = ? AND key = ?) FROM ` + t + `_fence WHERE id = 1`,
		reserveFences: `UPDATE ` + t + `_fence SET n = n + ?, owner = ? WHERE id = 1 RETURNING n`,
		// Ends another Store's block (fenceBlock); n moves so that its
		// holder starts counting its solo claims again.
		endFenceBlock: `UPDATE ` + t + `_fence SET n = n + 1, owner = 0 WHERE id = 1 AND owner = ?`,
		saveCheckpoint: `UPDATE ` + t + ` SET checkpoint = ?
			WHERE scope = ? AND key = ? AND token = ? AND state = 1 AND expires_at > ?`,
		endLease: `UPDATE ` + t + ` SET checkpoint = ?, lease_until = ?
			WHERE scope = ? AND key = ? AND token = ? AND state = 1 AND expires_at > ?`,
		// A held record's lease ended at 0 (the Unix epoch): the range
		// (0, now] skips the held records, and [0, 0] selects them.
		stuck: `SELECT scope, key, fingerprint, checkpoint, lease_until FROM ` + t + `
			WHERE state = 1 AND checkpoint IS NOT NULL AND lease_until > ? AND lease_until <= ? AND expires_at > ?
			ORDER BY lease_until LIMIT ?`,
		renew: `UPDATE ` + t + ` SET lease_until = ?
			WHERE scope = ? AND key = ? AND token = ? AND state = 1 AND expires_at > ?`,
		complete: `UPDATE ` + t + ` SET state = 2, token = NULL, response = ?, checkpoint = NULL
			WHERE scope = ? AND key = ? AND token = ? AND state = 1 AND expires_at > ?`,
		release: `DELETE FROM ` + t + ` WHERE scope = ? AND key = ? AND token = ? AND state = 1 AND expires_at > ?`,
		deleteExpired: `DELETE FROM ` + t + ` WHERE (scope, key) IN
			(SELECT scope, key FROM ` + t + ` WHERE expires_at <= ? ORDER BY expires_at LIMIT ?)`,
	}
}

func (s *Store) prepare(ctx context.Context) error {
	writes := []struct {
		dst  **sql.Stmt
		text string
	}{
		{&s.st.get, s.sql.get},
		{&s.st.claim, s.sql.claim},
		{&s.st.takeOver, s.sql.takeOver},
		{&s.st.renew, s.sql.renew},
		{&s.st.complete, s.sql.complete},
		{&s.st.release, s.sql.release},
		{&s.st.deleteExpired, s.sql.deleteExpired},
		{&s.st.readFence, s.sql.readFence},
		{&s.st.reserveFences, s.sql.reserveFences},
		{&s.st.endFenceBlock, s.sql.endFenceBlock},
		{&s.st.saveCheckpoint, s.sql.saveCheckpoint},
		{&s.st.endLease, s.sql.endLease},
		{&s.st.stuck, s.sql.stuck},
		{&s.st.put, s.sql.put},
	}
	for _, w := range writes {
		st, err := s.writer.PrepareContext(ctx, w.text)
		if err != nil {
			return err
		}
		*w.dst = st
	}
	var err error
	s.st.getRead, err = s.reader.PrepareContext(ctx, s.sql.get)
	return err
}

// in returns st bound to tx when there is one.
func in(ctx context.Context, tx *sql.Tx, st *sql.Stmt) *sql.Stmt {
	if tx == nil {
		return st
	}
	return tx.StmtContext(ctx, st)
}

// row is a record as read from the table.
type row struct {
	fingerprint string
	state       int
	leaseUntil  int64
	expiresAt   int64
	response    []byte
}

func get(ctx context.Context, st *sql.Stmt, scope, key string) (row, bool, error) {
	var r row
	err := st.QueryRowContext(ctx, scope, key).Scan(&r.fingerprint, &r.state, &r.leaseUntil, &r.expiresAt, &r.response)
	if errors.Is(err, sql.ErrNoRows) {
		return r, false, nil
	}
	return r, err == nil, err
}

func nanos(t int64) time.Time { return time.Unix(0, t).UTC() }

// decide returns the outcome of a claim that finds r at time now, or false
// if the claim must write (the record is absent, expired, or its lease is
// to be taken over).
func decide(r row, found bool, fp string, now int64) (idemstore.ClaimResult, bool, error) {
	if !found || now >= r.expiresAt {
		return idemstore.ClaimResult{}, false, nil
	}
	rec := idemstore.Record{Fingerprint: r.fingerprint, ExpiresAt: nanos(r.expiresAt), State: idemstore.StateInFlight}
	switch {
	case r.fingerprint != fp:
		if r.state == stateCompleted {
			rec.State = idemstore.StateCompleted
		}
		return idemstore.ClaimResult{Outcome: idemstore.ClaimMismatch, Record: rec}, true, nil
	case r.state == stateCompleted:
		rec.State = idemstore.StateCompleted
		resp := new(idemstore.Response)
		if err := resp.UnmarshalBinary(r.response); err != nil {
			return idemstore.ClaimResult{}, true, fmt.Errorf("sqlitestore: stored response: %w", err)
		}
		rec.Response = resp
		return idemstore.ClaimResult{Outcome: idemstore.ClaimCompleted, Record: rec}, true, nil
	case now < r.leaseUntil:
		rec.LeaseExpiresAt = nanos(r.leaseUntil)
		return idemstore.ClaimResult{Outcome: idemstore.ClaimInFlight, Record: rec}, true, nil
	}
	return idemstore.ClaimResult{}, false, nil
}

// Claim implements idemstore.Store.
func (s *Store) Claim(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	res, r, done, err := s.answerFirst(ctx, p)
	if done || err != nil {
		return res, err
	}
	// The record is absent, expired or abandoned: decide again under the
	// write lock, and write.
	if r.live {
		return s.takeOver(ctx, p, r.row)
	}
	res, _, err = s.claimLocked(ctx, p, p.Now.UnixNano(), false)
	if err != nil {
		return idemstore.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	return res, nil
}

// seen is the record a claim's first read found; live reports that it
// had not expired (an in-flight record whose lease ended: a take-over).
type seen struct {
	row
	live bool
}

// answerFirst is what Claim and ClaimTx do before they write: check the
// parameters and answer a duplicate from a read, without the write lock.
// done reports that res is the answer.
func (s *Store) answerFirst(ctx context.Context, p idemstore.ClaimParams) (res idemstore.ClaimResult, r seen, done bool, err error) {
	if p.Lease <= 0 || p.TTL <= 0 {
		return res, r, false, errors.New("sqlitestore: claim needs a positive lease and TTL")
	}
	now := p.Now.UnixNano()
	row, found, err := get(ctx, s.st.getRead, p.Scope, p.Key)
	if err != nil {
		return res, r, false, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	if res, done, err = decide(row, found, p.Fingerprint, now); done || err != nil {
		return res, r, done, err
	}
	return res, seen{row: row, live: found && now < row.expiresAt}, false, nil
}

// takeOver takes over the in-flight record r whose lease looked expired,
// in its own committed transaction. If someone holds the write lock, it
// is most likely the owner, whose renewals inside its open transaction are
// not visible yet: the whole take-over gets takeOverWait, and otherwise the
// answer is "in progress" rather than a wait behind the owner.
func (s *Store) takeOver(ctx context.Context, p idemstore.ClaimParams, r row) (idemstore.ClaimResult, error) {
	wctx, cancel := context.WithTimeout(ctx, takeOverWait)
	defer cancel()
	res, _, err := s.claimLocked(wctx, p, p.Now.UnixNano(), false)
	if err != nil {
		if ctx.Err() == nil && wctx.Err() != nil {
			// Nothing was taken over (or, if the commit raced the
			// deadline, a take-over nobody runs, which the next claim
			// takes over again after the lease).
			return idemstore.ClaimResult{Outcome: idemstore.ClaimInFlight, Record: idemstore.Record{
				State: idemstore.StateInFlight, Fingerprint: r.fingerprint, ExpiresAt: nanos(r.expiresAt), LeaseExpiresAt: nanos(r.leaseUntil),
			}}, nil
		}
		return idemstore.ClaimResult{}, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	return res, nil
}

// takeOverWait bounds how long a claim that would take over an abandoned
// record may take, waiting for the write lock included, before it answers
// "in progress".
const takeOverWait = 100 * time.Millisecond

// claimLocked decides and writes a claim in an immediate transaction (the
// writer's DSN sets _txlock=immediate), so the decision is made under the
// write lock. The upsert inserts an absent key or replaces an expired
// record in one statement; only if a live record is there is it read, to
// answer or to take it over.
//
// With keepOpen (ClaimTx), the record is read instead; a claim of an
// absent or expired record returns its transaction uncommitted, with the
// record not written yet (the caller's pendingClaim); a take-over commits
// as without it.
func (s *Store) claimLocked(ctx context.Context, p idemstore.ClaimParams, now int64, keepOpen bool) (res idemstore.ClaimResult, open *sql.Tx, err error) {
	for range 3 {
		res, open, err = s.claimOnce(ctx, p, now, keepOpen)
		var held errFenceBlockHeld
		if !errors.As(err, &held) {
			return res, open, err
		}
		if _, err := s.st.endFenceBlock.ExecContext(ctx, held.owner); err != nil {
			return idemstore.ClaimResult{}, nil, fmt.Errorf("fence: %w", err)
		}
	}
	return res, open, err
}

// claimOnce is claimLocked's transaction.
func (s *Store) claimOnce(ctx context.Context, p idemstore.ClaimParams, now int64, keepOpen bool) (res idemstore.ClaimResult, open *sql.Tx, err error) {
	tx, err := s.writer.BeginTx(ctx, nil)
	if err != nil {
		return res, nil, err
	}
	defer func() {
		if open == nil {
			tx.Rollback()
		}
	}()
	lease, expires := p.Now.Add(p.Lease).UnixNano(), p.Now.Add(p.TTL).UnixNano()
	res = idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: idemstore.Record{
		State: idemstore.StateInFlight, Fingerprint: p.Fingerprint, ExpiresAt: nanos(expires), LeaseExpiresAt: nanos(lease),
	}}
	fence, expiresAt, err := s.nextFence(ctx, tx, p.Scope, p.Key)
	if err != nil {
		return idemstore.ClaimResult{}, nil, fmt.Errorf("fence: %w", err)
	}
	res.Record.Fence = fence
	var r row
	var found bool
	if keepOpen {
		// The record is written when the claim's transaction first needs
		// it (see pendingClaim): usually as completed, by Complete.
		if !expiresAt.Valid || now >= expiresAt.Int64 {
			return res, tx, nil
		}
		if r, found, err = get(ctx, tx.StmtContext(ctx, s.st.get), p.Scope, p.Key); err != nil {
			return idemstore.ClaimResult{}, nil, err
		}
	} else {
		n, err := execRows(ctx, tx.StmtContext(ctx, s.st.claim), p.Scope, p.Key, p.Fingerprint, p.Token, lease, expires, res.Record.Fence, now)
		if err != nil {
			return idemstore.ClaimResult{}, nil, err
		}
		if n == 1 {
			return res, nil, tx.Commit()
		}
		if r, found, err = get(ctx, tx.StmtContext(ctx, s.st.get), p.Scope, p.Key); err != nil {
			return idemstore.ClaimResult{}, nil, err
		}
	}
	if res, done, err := decide(r, found, p.Fingerprint, now); done || err != nil {
		return res, nil, err
	}
	// An in-flight record with the same fingerprint whose lease ended.
	var kept int64
	err = tx.StmtContext(ctx, s.st.takeOver).QueryRowContext(ctx, p.Token, lease, res.Record.Fence, p.Scope, p.Key, p.Fingerprint, now, now).
		Scan(&res.Record.Checkpoint, &kept)
	res.Record.ExpiresAt = nanos(kept)
	if errors.Is(err, sql.ErrNoRows) {
		return idemstore.ClaimResult{}, nil, errors.New("take-over changed no row under the write lock")
	}
	if err != nil {
		return idemstore.ClaimResult{}, nil, err
	}
	res.TookOver = true
	return res, nil, tx.Commit()
}

// ClaimTx implements idemstore.TxClaimer (Config.ClaimInTx). Duplicates are
// answered by a read, as in Claim, once recent claims were mostly of keys
// that had a record (Store.mix); while most were of new keys, the claim
// goes straight to the write lock, whose transaction reads the key anyway
// and answers a duplicate as well. A new key is claimed in an immediate
// transaction that stays open, holding the file's write lock, for the
// operation's writes: a concurrent claim of the same key waits for the
// write lock, as every writer does, within its context's deadline
// (idem.Config.StoreTimeout), and then answers from what the transaction
// committed. A take-over of an abandoned record commits on its own, as in
// Claim.
func (s *Store) ClaimTx(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, idemstore.Tx, error) {
	if s.mix.MostlyNew() {
		if p.Lease <= 0 || p.TTL <= 0 {
			return idemstore.ClaimResult{}, nil, errors.New("sqlitestore: claim needs a positive lease and TTL")
		}
		res, tx, err := s.claimTxLocked(ctx, p)
		if err == nil {
			s.mix.Record(tx == nil)
		}
		return res, tx, err
	}
	res, r, done, err := s.answerFirst(ctx, p)
	if err != nil {
		return res, nil, err
	}
	s.mix.Record(done || r.live)
	if done {
		return res, nil, nil
	}
	if r.live {
		res, err := s.takeOver(ctx, p, r.row)
		return res, nil, err
	}
	return s.claimTxLocked(ctx, p)
}

// claimTxLocked is ClaimTx under the write lock: a claim of an absent or
// expired record returns its open transaction; any other answer (a
// duplicate, a mismatch, a take-over, committed) returns none.
func (s *Store) claimTxLocked(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, idemstore.Tx, error) {
	res, tx, err := s.claimLocked(ctx, p, p.Now.UnixNano(), true)
	if err != nil {
		return idemstore.ClaimResult{}, nil, fmt.Errorf("sqlitestore: claim: %w", err)
	}
	if tx == nil {
		return res, nil, nil
	}
	return res, &storeTx{s: s, tx: tx, pending: &pendingClaim{
		scope: p.Scope, key: p.Key, fingerprint: p.Fingerprint, token: p.Token,
		claimedAt: p.Now.UnixNano(), lease: res.Record.LeaseExpiresAt.UnixNano(), expires: res.Record.ExpiresAt.UnixNano(),
		fence: res.Record.Fence,
	}}, nil
}

// pendingClaim is a claim made by ClaimTx whose record is not written yet.
// Nobody sees an uncommitted claim, and the transaction holds the file's
// write lock, so nothing can take the key meanwhile: the record is written
// once, when the transaction first needs it. Complete then inserts it
// completed, so that a first execution writes the record's pages once and
// never enters (and leaves) the index of in-flight records. SaveCheckpoint,
// Native and a Commit without Complete write it in flight first, as
// ClaimTx used to.
type pendingClaim struct {
	scope, key, fingerprint, token   string
	claimedAt, lease, expires, fence int64
}

// is reports whether the parameters name the pending claim's record and
// owner.
func (c *pendingClaim) is(scope, key, token string) bool {
	return c != nil && c.scope == scope && c.key == key && c.token == token
}

func execRows(ctx context.Context, st *sql.Stmt, args ...any) (int64, error) {
	res, err := st.ExecContext(ctx, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// fenced runs a statement that changes only a record owned by token, and
// turns "no such row" into idemstore.ErrLeaseLost.
func fenced(ctx context.Context, st *sql.Stmt, op string, args ...any) error {
	n, err := execRows(ctx, st, args...)
	if err != nil {
		return fmt.Errorf("sqlitestore: %s: %w", op, err)
	}
	if n == 0 {
		return fmt.Errorf("sqlitestore: %s: %w", op, idemstore.ErrLeaseLost)
	}
	return nil
}

// Renew implements idemstore.Store.
func (s *Store) Renew(ctx context.Context, p idemstore.RenewParams) error {
	return s.renew(ctx, nil, p)
}

func (s *Store) renew(ctx context.Context, tx *sql.Tx, p idemstore.RenewParams) error {
	return fenced(ctx, in(ctx, tx, s.st.renew), "renew", p.Now.Add(p.Lease).UnixNano(), p.Scope, p.Key, p.Token, p.Now.UnixNano())
}

// Complete implements idemstore.Store.
func (s *Store) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	return s.complete(ctx, nil, p)
}

// CompleteTx completes the record inside the caller's transaction, which
// must be a transaction on DB(): the caller's business writes, the
// owner-token check and the stored response then commit together. It
// returns idemstore.ErrLeaseLost when the token no longer owns the record; the
// caller must then roll back. It is the non-HTTP form of what the
// middleware does with Tx.
func (s *Store) CompleteTx(ctx context.Context, tx *sql.Tx, p idemstore.CompleteParams) error {
	return s.complete(ctx, tx, p)
}

func (s *Store) complete(ctx context.Context, tx *sql.Tx, p idemstore.CompleteParams) error {
	enc, err := s.encode(p)
	if err != nil {
		return err
	}
	return fenced(ctx, in(ctx, tx, s.st.complete), "complete", enc, p.Scope, p.Key, p.Token, p.Now.UnixNano())
}

// encode returns the stored form of p's response, within the size limit.
func (s *Store) encode(p idemstore.CompleteParams) ([]byte, error) {
	if p.Response == nil {
		return nil, errors.New("sqlitestore: complete needs a response")
	}
	if n := p.Response.EncodedSize(); n > s.maxLen {
		return nil, fmt.Errorf("sqlitestore: complete: %d-byte response over the %d-byte limit: %w", n, s.maxLen, idemstore.ErrResponseTooLarge)
	}
	enc, err := p.Response.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: complete: %w", err)
	}
	return enc, nil
}

// Release implements idemstore.Store.
func (s *Store) Release(ctx context.Context, p idemstore.ReleaseParams) error {
	return fenced(ctx, s.st.release, "release", p.Scope, p.Key, p.Token, p.Now.UnixNano())
}

// DeleteExpired implements idemstore.Store. Each call is one short write
// transaction using the index on the expiry time.
func (s *Store) DeleteExpired(ctx context.Context, p idemstore.DeleteExpiredParams) (int, error) {
	if p.Limit <= 0 {
		return 0, errors.New("sqlitestore: DeleteExpired needs a positive limit")
	}
	n, err := execRows(ctx, s.st.deleteExpired, p.Now.UnixNano(), p.Limit)
	if err != nil {
		return 0, fmt.Errorf("sqlitestore: delete expired: %w", err)
	}
	return int(n), nil
}

// SaveCheckpoint implements idemstore.StepStore.
func (s *Store) SaveCheckpoint(ctx context.Context, p idemstore.SaveCheckpointParams) error {
	return s.saveCheckpoint(ctx, nil, p)
}

// SaveCheckpointTx is SaveCheckpoint inside the caller's transaction on
// DB(): a step's business writes and its recovery point commit together.
// It returns idemstore.ErrLeaseLost when the token no longer owns the record;
// the caller must then roll back.
func (s *Store) SaveCheckpointTx(ctx context.Context, tx *sql.Tx, p idemstore.SaveCheckpointParams) error {
	return s.saveCheckpoint(ctx, tx, p)
}

func (s *Store) saveCheckpoint(ctx context.Context, tx *sql.Tx, p idemstore.SaveCheckpointParams) error {
	if len(p.Checkpoint) == 0 {
		return errors.New("sqlitestore: empty checkpoint")
	}
	now := p.Now.UnixNano()
	if p.EndLease || p.Hold {
		end := now
		if p.Hold {
			end = heldLeaseEnd
		}
		return fenced(ctx, in(ctx, tx, s.st.endLease), "save checkpoint", p.Checkpoint, end, p.Scope, p.Key, p.Token, now)
	}
	return fenced(ctx, in(ctx, tx, s.st.saveCheckpoint), "save checkpoint", p.Checkpoint, p.Scope, p.Key, p.Token, now)
}

// heldLeaseEnd is the lease end of a record held for an operator
// (idemstore.SaveCheckpointParams.Hold): the Unix epoch, in nanoseconds.
const heldLeaseEnd = 0

// Stuck implements idemstore.StepStore, walking the partial index of the
// in-flight records in the order of their leases' ends.
func (s *Store) Stuck(ctx context.Context, p idemstore.StuckParams) ([]idemstore.StuckRecord, error) {
	if p.Limit <= 0 {
		return nil, errors.New("sqlitestore: Stuck needs a positive limit")
	}
	now := p.Now.UnixNano()
	after, upTo := int64(heldLeaseEnd), now
	if p.Held {
		after, upTo = heldLeaseEnd-1, heldLeaseEnd
	}
	rows, err := s.st.stuck.QueryContext(ctx, after, upTo, now, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: stuck: %w", err)
	}
	defer rows.Close()
	var out []idemstore.StuckRecord
	for rows.Next() {
		var r idemstore.StuckRecord
		var lease int64
		if err := rows.Scan(&r.Scope, &r.Key, &r.Fingerprint, &r.Checkpoint, &lease); err != nil {
			return nil, fmt.Errorf("sqlitestore: stuck: %w", err)
		}
		r.LeaseExpiresAt = nanos(lease)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlitestore: stuck: %w", err)
	}
	return out, nil
}

// BeginTx implements idemstore.TxStore: an immediate transaction on the writer.
func (s *Store) BeginTx(ctx context.Context) (idemstore.Tx, error) {
	tx, err := s.writer.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: begin: %w", err)
	}
	return &storeTx{s: s, tx: tx}, nil
}

type storeTx struct {
	s  *Store
	tx *sql.Tx

	// mu guards pending and broken: the core renews from its own
	// goroutine.
	mu      sync.Mutex
	pending *pendingClaim // ClaimTx's record, until it is written
	// broken is the failure of a statement the transaction ran for the
	// core (a renewal, a checkpoint, a completion). SQLite rolls the whole
	// transaction back when a write in it is interrupted (its context
	// ended: the core cancels a renewal still running when the operation
	// returns), and the connection then runs every later statement in
	// autocommit mode: a completion would commit the stored response alone,
	// without the business writes it answers for. After such a failure
	// the transaction refuses to write or commit anything more.
	broken error
}

// fail records err, the failure of one of the transaction's statements,
// unless the statement ran and only found the lease gone; t.mu is held.
func (t *storeTx) fail(err error) error {
	if err != nil && !errors.Is(err, idemstore.ErrLeaseLost) && t.broken == nil {
		t.broken = err
	}
	return err
}

// usable returns an error if a statement of the transaction failed
// before; t.mu is held.
func (t *storeTx) usable() error {
	if t.broken != nil {
		return fmt.Errorf("sqlitestore: the transaction may have been rolled back by an earlier failure (%v)", t.broken)
	}
	return nil
}

func (t *storeTx) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.usable(); err != nil {
		return err
	}
	if c := t.pending; c.is(p.Scope, p.Key, p.Token) {
		enc, err := t.s.encode(p)
		if err != nil {
			return err
		}
		if p.Now.UnixNano() >= c.expires {
			return fmt.Errorf("sqlitestore: complete: %w", idemstore.ErrLeaseLost)
		}
		if err := t.fail(t.put(ctx, stateCompleted, nil, enc)); err != nil {
			return fmt.Errorf("sqlitestore: complete: %w", err)
		}
		return nil
	}
	if err := t.materialize(ctx); err != nil {
		return err
	}
	return t.fail(t.s.complete(ctx, t.tx, p))
}

// put writes the pending claim's record in state st, and forgets the
// claim. It replaces an expired record of the key, as the claim
// statement does; anything else there is an error (the write lock was
// held since the claim read the key).
func (t *storeTx) put(ctx context.Context, st int, token any, response []byte) error {
	c := t.pending
	n, err := execRows(ctx, t.tx.StmtContext(ctx, t.s.st.put), c.scope, c.key, c.fingerprint, st, token, c.lease, c.expires, response, c.fence, c.claimedAt)
	if err != nil {
		return err
	}
	if n != 1 {
		return errors.New("the claimed key changed under the write lock")
	}
	t.pending = nil
	return nil
}

// materialize writes the pending claim's record in flight, if there is
// one, so that statements on the transaction see it; t.mu is held.
func (t *storeTx) materialize(ctx context.Context) error {
	if t.pending == nil {
		return nil
	}
	if err := t.fail(t.put(ctx, stateInFlight, t.pending.token, nil)); err != nil {
		return fmt.Errorf("sqlitestore: write the claim: %w", err)
	}
	return nil
}

// SaveCheckpoint implements idemstore.CheckpointTx.
func (t *storeTx) SaveCheckpoint(ctx context.Context, p idemstore.SaveCheckpointParams) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.usable(); err != nil {
		return err
	}
	if err := t.materialize(ctx); err != nil {
		return err
	}
	return t.fail(t.s.saveCheckpoint(ctx, t.tx, p))
}

// Renew renews inside the transaction: it holds the file's write lock, so
// a renewal on another connection would wait for it to end. A pending
// claim's renewal only moves the lease end it will be written with.
func (t *storeTx) Renew(ctx context.Context, p idemstore.RenewParams) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.usable(); err != nil {
		return err
	}
	if c := t.pending; c.is(p.Scope, p.Key, p.Token) {
		if p.Now.UnixNano() >= c.expires {
			return fmt.Errorf("sqlitestore: renew: %w", idemstore.ErrLeaseLost)
		}
		c.lease = p.Now.Add(p.Lease).UnixNano()
		return nil
	}
	return t.fail(t.s.renew(ctx, t.tx, p))
}

// Commit commits the transaction; a claim neither completed nor written
// yet is written in flight first, as ClaimTx promises.
func (t *storeTx) Commit(ctx context.Context) error {
	t.mu.Lock()
	err := t.usable()
	if err == nil {
		err = t.materialize(ctx)
	}
	t.mu.Unlock()
	if err != nil {
		t.tx.Rollback()
		return err
	}
	if err := t.tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: commit: %w", err)
	}
	return nil
}

func (t *storeTx) Rollback(context.Context) error {
	t.mu.Lock()
	t.pending = nil
	t.mu.Unlock()
	if err := t.tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("sqlitestore: rollback: %w", err)
	}
	return nil
}

// Native returns the *sql.Tx. It writes a pending claim's record first,
// so that what the caller does with the transaction (CompleteTx, its own
// queries) sees the in-flight record.
func (t *storeTx) Native() any {
	t.mu.Lock()
	defer t.mu.Unlock()
	// An error here leaves the claim pending; Complete and Commit try
	// again and report it.
	_ = t.materialize(context.Background())
	return t.tx
}

// Tx returns the transaction of the idempotent execution ctx belongs to,
// beginning it on first use (see the package documentation for what that
// costs). Write the operation's business rows through it: they commit with
// the stored response, or roll back if the handler fails, panics or loses
// its lease. Outside an execution on a sqlitestore it returns an error
// wrapping idem.ErrNoTx.
func Tx(ctx context.Context) (*sql.Tx, error) {
	st, err := idem.TxFromContext(ctx)
	if err != nil {
		return nil, err
	}
	t, ok := st.(*storeTx)
	if !ok {
		return nil, fmt.Errorf("sqlitestore: the execution's store is not a sqlitestore: %w", idem.ErrNoTx)
	}
	return t.tx, nil
}
