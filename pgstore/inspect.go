package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemhq/idem"
	"github.com/jackc/pgx/v5"
)

var _ idem.Inspector = (*Store)(nil)

// Get implements idem.Inspector, with the checkpoint of a record in
// flight. Expiry is decided by the database's clock; p.Now is ignored.
func (s *Store) Get(ctx context.Context, p idem.GetParams) (idem.RecordInfo, error) {
	var (
		fp         string
		leaseEnd   *time.Time
		expiresAt  time.Time
		resp       []byte
		checkpoint []byte
	)
	err := s.pool.QueryRow(ctx, `SELECT fingerprint, lease_expires_at, expires_at, response, checkpoint FROM `+s.table+
		` WHERE scope = $1 AND key = $2 AND expires_at > statement_timestamp()`, p.Scope, p.Key).
		Scan(&fp, &leaseEnd, &expiresAt, &resp, &checkpoint)
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.RecordInfo{}, idem.ErrNotFound
	}
	if err != nil {
		return idem.RecordInfo{}, fmt.Errorf("pgstore: get: %w", err)
	}
	ri := info(p.Scope, p.Key, fp, leaseEnd, expiresAt, len(resp), resp != nil)
	if resp != nil {
		ri.Response = new(idem.Response)
		if err := ri.Response.UnmarshalBinary(resp); err != nil {
			return idem.RecordInfo{}, fmt.Errorf("pgstore: get: stored response: %w", err)
		}
	} else if len(checkpoint) > 0 {
		ri.Checkpoint = checkpoint
	}
	return ri, nil
}

func info(scope, key, fp string, leaseEnd *time.Time, expiresAt time.Time, size int, completed bool) idem.RecordInfo {
	ri := idem.RecordInfo{Scope: scope, Key: key, ResponseSize: size, Record: idem.Record{
		State: idem.StateInFlight, Fingerprint: fp, ExpiresAt: expiresAt.UTC()}}
	if completed {
		ri.State = idem.StateCompleted
	} else if leaseEnd != nil {
		ri.LeaseExpiresAt = leaseEnd.UTC()
	}
	return ri
}

// List implements idem.Inspector; records come sorted by (Scope, Key), read
// in primary-key order. A Key or State filter may scan the table: it is an
// operator's tool, not a request path.
func (s *Store) List(ctx context.Context, p idem.ListParams) ([]idem.RecordInfo, error) {
	if p.Limit <= 0 {
		return nil, errors.New("pgstore: List needs a positive limit")
	}
	q := `SELECT scope, key, fingerprint, lease_expires_at, expires_at, response IS NOT NULL, coalesce(octet_length(response), 0)
FROM ` + s.table + ` WHERE expires_at > statement_timestamp() AND ($1 = '' OR key = $1)`
	switch p.State {
	case idem.StateInFlight:
		q += ` AND token IS NOT NULL`
	case idem.StateCompleted:
		q += ` AND token IS NULL`
	}
	rows, err := s.pool.Query(ctx, q+` ORDER BY scope, key LIMIT $2`, p.Key, p.Limit)
	if err != nil {
		return nil, fmt.Errorf("pgstore: list: %w", err)
	}
	var (
		scope, key, fp string
		leaseEnd       *time.Time
		expiresAt      time.Time
		completed      bool
		size           int
	)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (idem.RecordInfo, error) {
		if err := r.Scan(&scope, &key, &fp, &leaseEnd, &expiresAt, &completed, &size); err != nil {
			return idem.RecordInfo{}, err
		}
		return info(scope, key, fp, leaseEnd, expiresAt, size, completed), nil
	})
	if err != nil {
		return nil, fmt.Errorf("pgstore: list: %w", err)
	}
	return out, nil
}

// Delete implements idem.Inspector: in one transaction, it locks the live
// record, checks its state and deletes it.
func (s *Store) Delete(ctx context.Context, p idem.DeleteParams) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var inFlight bool
		err := tx.QueryRow(ctx, `SELECT token IS NOT NULL FROM `+s.table+
			` WHERE scope = $1 AND key = $2 AND expires_at > statement_timestamp() FOR UPDATE`, p.Scope, p.Key).Scan(&inFlight)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			return idem.ErrNotFound
		case err != nil:
			return err
		case inFlight && !p.Force:
			return idem.ErrInFlight
		}
		_, err = tx.Exec(ctx, `DELETE FROM `+s.table+` WHERE scope = $1 AND key = $2`, p.Scope, p.Key)
		return err
	})
	if err != nil && !errors.Is(err, idem.ErrNotFound) && !errors.Is(err, idem.ErrInFlight) {
		return fmt.Errorf("pgstore: delete: %w", err)
	}
	return err
}
