package sqlitestore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idemhq/idem"
)

var _ idem.Inspector = (*Store)(nil)

// Get implements idem.Inspector, with the checkpoint of a record in
// flight. It reads through the read-only pool.
func (s *Store) Get(ctx context.Context, p idem.GetParams) (idem.RecordInfo, error) {
	var (
		r          row
		resp       []byte
		checkpoint []byte
	)
	err := s.reader.QueryRowContext(ctx, `SELECT fingerprint, state, lease_until, expires_at, response, checkpoint FROM `+s.table+
		` WHERE scope = ? AND key = ? AND expires_at > ?`, p.Scope, p.Key, p.Now.UnixNano()).
		Scan(&r.fingerprint, &r.state, &r.leaseUntil, &r.expiresAt, &resp, &checkpoint)
	if errors.Is(err, sql.ErrNoRows) {
		return idem.RecordInfo{}, idem.ErrNotFound
	}
	if err != nil {
		return idem.RecordInfo{}, fmt.Errorf("sqlitestore: get: %w", err)
	}
	ri := info(p.Scope, p.Key, r, len(resp))
	if r.state == stateCompleted {
		ri.Response = new(idem.Response)
		if err := ri.Response.UnmarshalBinary(resp); err != nil {
			return idem.RecordInfo{}, fmt.Errorf("sqlitestore: get: stored response: %w", err)
		}
	} else if len(checkpoint) > 0 {
		ri.Checkpoint = checkpoint
	}
	return ri, nil
}

func info(scope, key string, r row, size int) idem.RecordInfo {
	ri := idem.RecordInfo{Scope: scope, Key: key, ResponseSize: size, Record: idem.Record{
		State: idem.StateInFlight, Fingerprint: r.fingerprint, ExpiresAt: nanos(r.expiresAt)}}
	if r.state == stateCompleted {
		ri.State = idem.StateCompleted
	} else {
		ri.LeaseExpiresAt = nanos(r.leaseUntil)
	}
	return ri
}

// List implements idem.Inspector; records come sorted by (Scope, Key).
// Without a State or Key it reads the table in primary-key order and stops
// at Limit; a Key alone scans the table.
func (s *Store) List(ctx context.Context, p idem.ListParams) ([]idem.RecordInfo, error) {
	if p.Limit <= 0 {
		return nil, errors.New("sqlitestore: List needs a positive limit")
	}
	q := `SELECT scope, key, fingerprint, state, lease_until, expires_at, COALESCE(length(response), 0) FROM ` + s.table +
		` WHERE expires_at > ?`
	args := []any{p.Now.UnixNano()}
	if p.State != 0 {
		q += ` AND state = ?`
		args = append(args, int(p.State)) // StateInFlight = 1, StateCompleted = 2, as in the table
	}
	if p.Key != "" {
		q += ` AND key = ?`
		args = append(args, p.Key)
	}
	rows, err := s.reader.QueryContext(ctx, q+` ORDER BY scope, key LIMIT ?`, append(args, p.Limit)...)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: list: %w", err)
	}
	defer rows.Close()
	var out []idem.RecordInfo
	for rows.Next() {
		var (
			scope, key string
			r          row
			size       int
		)
		if err := rows.Scan(&scope, &key, &r.fingerprint, &r.state, &r.leaseUntil, &r.expiresAt, &size); err != nil {
			return nil, fmt.Errorf("sqlitestore: list: %w", err)
		}
		out = append(out, info(scope, key, r, size))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("sqlitestore: list: %w", err)
	}
	return out, nil
}

// Delete implements idem.Inspector, in one immediate transaction.
func (s *Store) Delete(ctx context.Context, p idem.DeleteParams) error {
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
		return idem.ErrNotFound
	case err != nil:
		return fmt.Errorf("sqlitestore: delete: %w", err)
	case state == stateInFlight && !p.Force:
		return idem.ErrInFlight
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM `+s.table+` WHERE scope = ? AND key = ?`, p.Scope, p.Key); err != nil {
		return fmt.Errorf("sqlitestore: delete: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitestore: delete: %w", err)
	}
	return nil
}
