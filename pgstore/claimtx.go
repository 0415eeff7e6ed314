package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore/internal/pgdb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A claim made with ClaimTx saves two of a first execution's round trips,
// which cost about 0.13 ms each on the loopback of the benchmark machine
// (docs/BENCHMARKS.md): BEGIN travels in one batch with the claim
// statement (pgx's Batch.BeginTx), and the completion with COMMIT.

// ClaimTx implements idemstore.TxClaimer (idem.Config.ClaimInTx). With
// ReadFirst, while most recent claims met a record, duplicates are answered
// by the read, as in Claim. A new key is
// claimed by the claim statement inside a transaction that stays open for
// the operation's writes; the claim, the writes and the stored response
// then commit together, synchronously (AsyncClaim does not apply).
//
// A concurrent claim of the same key meets the uncommitted row: ClaimTx
// waits for it at most ClaimTxWait (the statement's lock_timeout) and then
// answers idemstore.ClaimInFlight; Claim waits within its context's deadline.
// The operation's own statements run with the session's default
// lock_timeout. A take-over of an abandoned record commits at once, as in
// Claim, and returns no transaction.
//
// While most claims are new, or when ReadFirst's read found no record, the
// claim is claimTxNewSQL, a plain INSERT that restores lock_timeout itself;
// if the key turns out to have a record, the claim statement follows in the
// same transaction (a second round trip). Otherwise the claim statement
// comes first, followed by the statement restoring lock_timeout.
//
// On a Store made by NewDB, database/sql sends BEGIN, the claim, the
// completion and COMMIT of a new key each in a round trip of its own: four
// where pgx batches them into two.
func (s *Store) ClaimTx(ctx context.Context, p idemstore.ClaimParams) (idemstore.ClaimResult, idemstore.Tx, error) {
	r, ok, insert, err := s.answerFirst(ctx, p)
	if ok || err != nil {
		return r, nil, err
	}
	for range claimAttempts {
		r, tx, ok, err := s.claimTxOnce(ctx, p, insert)
		switch {
		case sqlState(err) == "55P03":
			// lock_not_available: another transaction holds an
			// uncommitted claim of the key.
			s.dups.Record(true)
			return idemstore.ClaimResult{Outcome: idemstore.ClaimInFlight, Record: idemstore.Record{State: idemstore.StateInFlight}}, nil, nil
		case sqlState(err) == "40001" && ctx.Err() == nil:
			continue
		case err != nil:
			return idemstore.ClaimResult{}, nil, fmt.Errorf("pgstore: claim: %w", err)
		case ok:
			s.dups.Record(r.Outcome != idemstore.ClaimAcquired)
			return r, tx, nil
		}
	}
	return idemstore.ClaimResult{}, nil, fmt.Errorf("pgstore: claim: the record kept changing during %d attempts", claimAttempts)
}

// restoreLockTimeout ends the claim statement's lock_timeout for the rest
// of the transaction.
const restoreLockTimeout = "SET LOCAL lock_timeout TO DEFAULT"

// claimTxOnce acquires a connection and sends, in one round trip, BEGIN
// and, with insert, claimTxNewSQL; when that inserts nothing (the key has
// a record), or without insert, it sends ClaimTx's claim statement and the
// statement that restores lock_timeout, in the same transaction. It
// returns the transaction open only for a new record.
func (s *Store) claimTxOnce(ctx context.Context, p idemstore.ClaimParams, insert bool) (res idemstore.ClaimResult, open idemstore.Tx, ok bool, err error) {
	if s.pool == nil {
		return s.claimSQLTxOnce(ctx, p, insert)
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return res, nil, false, err
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	if insert {
		b.Queue(s.claimTxNewSQL, p.Scope, p.Key, p.Fingerprint, p.Token, p.Lease, p.TTL, s.claimTxWait)
	} else {
		s.queueClaimTx(b, p)
	}
	br := conn.SendBatch(ctx, b)
	ct := &claimedTx{storeTx: storeTx{s: s, tx: pgdb.PgxTx{T: br.Tx()}}, conn: conn}
	defer func() {
		if open == nil {
			_ = ct.Rollback(context.WithoutCancel(ctx))
		}
	}()
	_, err = br.Exec()
	inserted := false
	if err == nil {
		if insert {
			res, inserted, err = insertedClaim(p, br.QueryRow())
		} else {
			res, ok, err = s.claimTxResult(p, br)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err == nil && insert && !inserted {
		// The key has a record, or a claim of it committed before the
		// INSERT looked: the claim statement decides, in this
		// transaction.
		b := &pgx.Batch{}
		s.queueClaimTx(b, p)
		br := conn.SendBatch(ctx, b)
		res, ok, err = s.claimTxResult(p, br)
		if cerr := br.Close(); err == nil {
			err = cerr
		}
	}
	if inserted {
		ok = true
	}
	if err != nil || !ok || res.Outcome != idemstore.ClaimAcquired {
		return res, nil, ok, err
	}
	if res.TookOver {
		if err := ct.Commit(ctx); err != nil {
			return idemstore.ClaimResult{}, nil, false, err
		}
		return res, nil, true, nil
	}
	return res, ct, true, nil
}

// queueClaimTx queues ClaimTx's claim statement and the statement that
// restores lock_timeout after it.
func (s *Store) queueClaimTx(b *pgx.Batch, p idemstore.ClaimParams) {
	b.Queue(s.claimTxSQL, p.Scope, p.Key, p.Fingerprint, p.Token, p.Lease, p.TTL, s.claimTxWait)
	b.Queue(restoreLockTimeout)
}

// claimTxResult reads the results of what queueClaimTx queued.
func (s *Store) claimTxResult(p idemstore.ClaimParams, br pgx.BatchResults) (res idemstore.ClaimResult, ok bool, err error) {
	res, ok, err = claimResult(p, br.QueryRow())
	if err == nil {
		_, err = br.Exec()
	}
	return res, ok, err
}

// insertedClaim reads claimTxNewSQL's row: inserted is false when it
// returned none (the key has a record).
func insertedClaim(p idemstore.ClaimParams, row pgdb.Row) (res idemstore.ClaimResult, inserted bool, err error) {
	var (
		leaseEnd, expiresAt time.Time
		fence               int64
		restored            string
	)
	err = row.Scan(&leaseEnd, &expiresAt, &fence, &restored)
	if pgdb.IsNoRows(err) {
		return res, false, nil
	}
	if err != nil {
		return res, false, err
	}
	return idemstore.ClaimResult{Outcome: idemstore.ClaimAcquired, Record: idemstore.Record{
		State: idemstore.StateInFlight, Fingerprint: p.Fingerprint, ExpiresAt: expiresAt, LeaseExpiresAt: leaseEnd, Fence: fence,
	}}, true, nil
}

// claimSQLTxOnce is claimTxOnce on database/sql, one statement at a time.
// The transaction it returns is a plain storeTx: its Complete runs the
// completion in the transaction, as CompleteTx does.
func (s *Store) claimSQLTxOnce(ctx context.Context, p idemstore.ClaimParams, insert bool) (res idemstore.ClaimResult, open idemstore.Tx, ok bool, err error) {
	tx, err := s.db.Begin(ctx)
	if err != nil {
		return res, nil, false, err
	}
	defer func() {
		if open == nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if insert {
		res, inserted, err := insertedClaim(p, tx.QueryRow(ctx, s.claimTxNewSQL, p.Scope, p.Key, p.Fingerprint, p.Token, p.Lease, p.TTL, s.claimTxWait))
		if err != nil {
			return res, nil, false, err
		}
		if inserted {
			return res, &storeTx{s: s, tx: tx}, true, nil
		}
	}
	res, ok, err = claimResult(p, tx.QueryRow(ctx, s.claimTxSQL, p.Scope, p.Key, p.Fingerprint, p.Token, p.Lease, p.TTL, s.claimTxWait))
	if err != nil || !ok || res.Outcome != idemstore.ClaimAcquired {
		return res, nil, ok, err
	}
	if res.TookOver {
		if err := tx.Commit(ctx); err != nil {
			return idemstore.ClaimResult{}, nil, false, err
		}
		return res, nil, true, nil
	}
	if _, err := tx.Exec(ctx, restoreLockTimeout); err != nil {
		return idemstore.ClaimResult{}, nil, false, err
	}
	return res, &storeTx{s: s, tx: tx}, true, nil
}

// claimedTx is the idemstore.Tx ClaimTx returns on pgx. Its Complete checks the
// response's size and defers the statement to Commit, which sends it with
// COMMIT in one round trip: the record cannot change meanwhile, since no
// one else sees it before the commit.
//
// It holds the connection its transaction runs on, acquired from the pool,
// and releases it when the transaction ends. A commit sent with the
// completion is not seen by the pgx.Tx, which the operation no longer has
// (idem closes it when the operation returns); do not keep it beyond that.
type claimedTx struct {
	storeTx
	conn     *pgxpool.Conn
	released bool
	pending  []any // the completion's arguments, set by Complete
}

// release returns the connection to the pool once; pgxpool closes it
// instead if a transaction is still open on it.
func (t *claimedTx) release() {
	if !t.released {
		t.released = true
		t.conn.Release()
	}
}

// Complete implements idemstore.Tx. A token that no longer owns the
// record is reported by Commit, with idemstore.ErrLeaseLost, having committed
// nothing.
func (t *claimedTx) Complete(ctx context.Context, p idemstore.CompleteParams) error {
	enc, err := t.s.encodeResponse(p, "complete in transaction")
	if err != nil {
		return err
	}
	t.pending = []any{p.Scope, p.Key, p.Token, enc}
	return nil
}

// Commit implements idemstore.Tx: the deferred completion and COMMIT, in
// one round trip.
func (t *claimedTx) Commit(ctx context.Context) error {
	if t.released {
		return fmt.Errorf("pgstore: commit: %w", pgx.ErrTxClosed)
	}
	if t.pending == nil {
		defer t.release()
		return t.storeTx.Commit(ctx)
	}
	b := &pgx.Batch{}
	b.Queue(t.s.completeCheckedSQL, t.pending...)
	b.Queue("COMMIT")
	br := t.conn.SendBatch(ctx, b)
	_, cerr := br.Exec()
	tag, err := br.Exec()
	err = errors.Join(cerr, err, br.Close())
	if cerr != nil && sqlState(cerr) == "22012" {
		// The server skipped the COMMIT after the failed statement; the
		// transaction waits, aborted, for its rollback.
		_ = t.Rollback(ctx)
		return fmt.Errorf("pgstore: commit: %w", idemstore.ErrLeaseLost)
	}
	if err == nil && tag.String() != "COMMIT" {
		err = fmt.Errorf("the server answered %q", tag.String())
	}
	t.release()
	if err != nil {
		return fmt.Errorf("pgstore: commit: %w", err)
	}
	return nil
}

// Rollback implements idemstore.Tx, and returns the connection.
func (t *claimedTx) Rollback(ctx context.Context) error {
	if t.released {
		return nil
	}
	defer t.release()
	return t.storeTx.Rollback(ctx)
}
