package pgstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore/internal/pgdb"
)

var _ idemstore.Inspector = (*Store)(nil)

// errNoID answers a GetParams.ID or DeleteParams.ID: pgstore names records
// by scope and key only.
var errNoID = fmt.Errorf("pgstore: %w: records are named by scope and key", idemstore.ErrInvalidID)

// Get implements idemstore.Inspector, with the checkpoint of a record in
// flight. Expiry is decided by the database's clock; p.Now is ignored.
func (s *Store) Get(ctx context.Context, p idemstore.GetParams) (idemstore.RecordInfo, error) {
	if p.ID != "" {
		return idemstore.RecordInfo{}, errNoID
	}
	var (
		fp         string
		leaseEnd   *time.Time
		expiresAt  time.Time
		resp       []byte
		checkpoint []byte
	)
	err := s.db.QueryRow(ctx, `SELECT fingerprint, lease_expires_at, expires_at, response, checkpoint FROM `+s.table+
		` WHERE scope = $1 AND key = $2 AND expires_at > statement_timestamp()`, p.Scope, p.Key).
		Scan(&fp, &leaseEnd, &expiresAt, &resp, &checkpoint)
	if pgdb.IsNoRows(err) {
		return idemstore.RecordInfo{}, idemstore.ErrNotFound
	}
	if err != nil {
		return idemstore.RecordInfo{}, fmt.Errorf("pgstore: get: %w", err)
	}
	ri := info(p.Scope, p.Key, fp, leaseEnd, expiresAt, len(resp), resp != nil)
	if resp != nil {
		ri.Response = new(idemstore.Response)
		if err := ri.Response.UnmarshalBinary(resp); err != nil {
			return idemstore.RecordInfo{}, fmt.Errorf("pgstore: get: stored response: %w", err)
		}
	} else if len(checkpoint) > 0 {
		ri.Checkpoint = checkpoint
	}
	return ri, nil
}

func info(scope, key, fp string, leaseEnd *time.Time, expiresAt time.Time, size int, completed bool) idemstore.RecordInfo {
	ri := idemstore.RecordInfo{Scope: scope, Key: key, ResponseSize: size, Record: idemstore.Record{
		State: idemstore.StateInFlight, Fingerprint: fp, ExpiresAt: expiresAt.UTC()}}
	if completed {
		ri.State = idemstore.StateCompleted
	} else if leaseEnd != nil {
		ri.LeaseExpiresAt = leaseEnd.UTC()
	}
	return ri
}

// List implements idemstore.Inspector; records come in (Scope, Key) order, in
// the columns' collation (the database's default). Each page is one range
// scan of the primary key index from After, stopped after Limit+1 rows (the
// one more tells whether another page follows); a State or Key filter
// skips rows on that scan instead of sorting anything.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	q, args, err := s.listQuery(p)
	if err != nil {
		return idemstore.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
	}
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return idemstore.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
	}
	defer rows.Close()
	var (
		page           idemstore.ListPage
		scope, key, fp string
		leaseEnd       *time.Time
		expiresAt      time.Time
		completed      bool
		size           int
	)
	for rows.Next() {
		if len(page.Records) == p.Limit {
			last := page.Records[len(page.Records)-1]
			page.Next = idemstore.ListCursor(last.Scope, last.Key)
			break
		}
		if err := rows.Scan(&scope, &key, &fp, &leaseEnd, &expiresAt, &completed, &size); err != nil {
			return idemstore.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
		}
		page.Records = append(page.Records, info(scope, key, fp, leaseEnd, expiresAt, size, completed))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return idemstore.ListPage{}, fmt.Errorf("pgstore: list: %w", err)
	}
	return page, nil
}

// listQuery returns List's statement and arguments for p.
func (s *Store) listQuery(p idemstore.ListParams) (string, []any, error) {
	if p.Limit <= 0 {
		return "", nil, errors.New("the limit must be positive")
	}
	var b strings.Builder
	b.WriteString(`SELECT scope, key, fingerprint, lease_expires_at, expires_at, response IS NOT NULL, coalesce(octet_length(response), 0)
FROM ` + s.table + ` WHERE expires_at > statement_timestamp()`)
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if p.After != "" {
		scope, key, err := idemstore.ParseListCursor(p.After)
		if err != nil {
			return "", nil, err
		}
		// A row comparison: an index condition on the primary key.
		b.WriteString(` AND (scope, key) > (` + arg(scope) + `, ` + arg(key) + `)`)
	}
	switch p.State {
	case idemstore.StateInFlight:
		b.WriteString(` AND token IS NOT NULL`)
	case idemstore.StateCompleted:
		b.WriteString(` AND token IS NULL`)
	}
	if p.Key != "" {
		b.WriteString(` AND key = ` + arg(p.Key))
	}
	b.WriteString(` ORDER BY scope, key LIMIT ` + arg(int64(min(p.Limit, math.MaxInt-1)+1)))
	return b.String(), args, nil
}

// Delete implements idemstore.Inspector: in one transaction, it locks the live
// record, checks its state and deletes it.
func (s *Store) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	if p.ID != "" {
		return errNoID
	}
	err := pgdb.BeginFunc(ctx, s.db, func(tx pgdb.Tx) error {
		var inFlight bool
		err := tx.QueryRow(ctx, `SELECT token IS NOT NULL FROM `+s.table+
			` WHERE scope = $1 AND key = $2 AND expires_at > statement_timestamp() FOR UPDATE`, p.Scope, p.Key).Scan(&inFlight)
		switch {
		case pgdb.IsNoRows(err):
			return idemstore.ErrNotFound
		case err != nil:
			return err
		case inFlight && !p.Force:
			return idemstore.ErrInFlight
		}
		_, err = tx.Exec(ctx, `DELETE FROM `+s.table+` WHERE scope = $1 AND key = $2`, p.Scope, p.Key)
		return err
	})
	if err != nil && !errors.Is(err, idemstore.ErrNotFound) && !errors.Is(err, idemstore.ErrInFlight) {
		return fmt.Errorf("pgstore: delete: %w", err)
	}
	return err
}
