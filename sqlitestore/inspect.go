package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/idemhq/idem/idemstore"
)

var _ idemstore.Inspector = (*Store)(nil)

// errNoID answers a GetParams.ID or DeleteParams.ID: sqlitestore names
// records by scope and key only.
var errNoID = fmt.Errorf("sqlitestore: %w: records are named by scope and key", idemstore.ErrInvalidID)

// Get implements idemstore.Inspector, with the checkpoint of a record in
// flight. It reads through the read-only pool.
func (s *Store) Get(ctx context.Context, p idemstore.GetParams) (idemstore.RecordInfo, error) {
	if p.ID != "" {
		return idemstore.RecordInfo{}, errNoID
	}
	var (
		r          row
		resp       []byte
		checkpoint []byte
	)
	err := s.reader.QueryRowContext(ctx, `SELECT fingerprint, state, lease_until, expires_at, response, checkpoint FROM `+s.table+
		` WHERE scope = ? AND key = ? AND expires_at > ?`, p.Scope, p.Key, p.Now.UnixNano()).
		Scan(&r.fingerprint, &r.state, &r.leaseUntil, &r.expiresAt, &resp, &checkpoint)
	if errors.Is(err, sql.ErrNoRows) {
		return idemstore.RecordInfo{}, idemstore.ErrNotFound
	}
	if err != nil {
		return idemstore.RecordInfo{}, fmt.Errorf("sqlitestore: get: %w", err)
	}
	ri := info(p.Scope, p.Key, r, len(resp))
	if r.state == stateCompleted {
		ri.Response = new(idemstore.Response)
		if err := ri.Response.UnmarshalBinary(resp); err != nil {
			return idemstore.RecordInfo{}, fmt.Errorf("sqlitestore: get: stored response: %w", err)
		}
	} else if len(checkpoint) > 0 {
		ri.Checkpoint = checkpoint
	}
	return ri, nil
}

func info(scope, key string, r row, size int) idemstore.RecordInfo {
	ri := idemstore.RecordInfo{Scope: scope, Key: key, ResponseSize: size, Record: idemstore.Record{
		State: idemstore.StateInFlight, Fingerprint: r.fingerprint, ExpiresAt: nanos(r.expiresAt)}}
	if r.state == stateCompleted {
		ri.State = idemstore.StateCompleted
	} else {
		ri.LeaseExpiresAt = nanos(r.leaseUntil)
	}
	return ri
}

// List implements idemstore.Inspector; records come in (Scope, Key) byte order.
// Each page is one range read of the primary key from After, stopped after
// Limit+1 rows (the one more tells whether another page follows); a State
// or Key filter skips rows on that walk instead of sorting anything.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	q, args, err := s.listQuery(p)
	if err != nil {
		return idemstore.ListPage{}, fmt.Errorf("sqlitestore: list: %w", err)
	}
	rows, err := s.reader.QueryContext(ctx, q, args...)
	if err != nil {
		return idemstore.ListPage{}, fmt.Errorf("sqlitestore: list: %w", err)
	}
	defer rows.Close()
	var page idemstore.ListPage
	for rows.Next() {
		var (
			scope, key string
			r          row
			size       int
		)
		if err := rows.Scan(&scope, &key, &r.fingerprint, &r.state, &r.leaseUntil, &r.expiresAt, &size); err != nil {
			return idemstore.ListPage{}, fmt.Errorf("sqlitestore: list: %w", err)
		}
		if len(page.Records) == p.Limit {
			last := page.Records[len(page.Records)-1]
			page.Next = idemstore.ListCursor(last.Scope, last.Key)
			break
		}
		page.Records = append(page.Records, info(scope, key, r, size))
	}
	if err := rows.Err(); err != nil {
		return idemstore.ListPage{}, fmt.Errorf("sqlitestore: list: %w", err)
	}
	return page, nil
}

// listQuery returns List's statement and arguments for p.
func (s *Store) listQuery(p idemstore.ListParams) (string, []any, error) {
	if p.Limit <= 0 {
		return "", nil, errors.New("the limit must be positive")
	}
	var b strings.Builder
	// The unary + keeps SQLite from answering the expiry (or state) term
	// from the expires_at index, which would then sort every live record
	// for each page: the primary key gives the order.
	b.WriteString(`SELECT scope, key, fingerprint, state, lease_until, expires_at, COALESCE(length(response), 0) FROM ` + s.table +
		` WHERE +expires_at > ?`)
	args := []any{p.Now.UnixNano()}
	if p.After != "" {
		scope, key, err := idemstore.ParseListCursor(p.After)
		if err != nil {
			return "", nil, err
		}
		// A row value: SQLite reads the primary key from this position on.
		b.WriteString(` AND (scope, key) > (?, ?)`)
		args = append(args, scope, key)
	}
	if p.State != 0 {
		b.WriteString(` AND +state = ?`)
		args = append(args, int(p.State)) // StateInFlight = 1, StateCompleted = 2, as in the table
	}
	if p.Key != "" {
		b.WriteString(` AND key = ?`)
		args = append(args, p.Key)
	}
	b.WriteString(` ORDER BY scope, key LIMIT ?`)
	return b.String(), append(args, min(p.Limit, math.MaxInt-1)+1), nil
}

// Delete implements idemstore.Inspector, in one immediate transaction.
func (s *Store) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	if p.ID != "" {
		return errNoID
	}
	tx, err := s.writer.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlitestore: delete: %w", err)
	}
	defer tx.Rollback()
	var state int
	err = tx.QueryRowContext(ctx, `SELECT state FROM `+s.table+` WHERE scope = ? AND key = ? AND expires_at > ?`,
		p.Scope, p.Key, p.Now.UnixNano()).Scan(&state)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return idemstore.ErrNotFound
	case err != nil:
		return fmt.Errorf("sqlitestore: delete: %w", err)
	case state == stateInFlight && !p.Force:
		return idemstore.ErrInFlight
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM `+s.table+` WHERE scope = ? AND key = ?`, p.Scope, p.Key); err != nil {
		return fmt.Errorf("sqlitestore: delete: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: delete: %w", err)
	}
	return nil
}
