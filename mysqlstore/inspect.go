package mysqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/idemhq/idem/idemstore"
)

// errNoID answers a GetParams.ID or DeleteParams.ID: mysqlstore names
// records by scope and key only.
var errNoID = fmt.Errorf("mysqlstore: %w: records are named by scope and key", idemstore.ErrInvalidID)

// Get implements idemstore.Inspector, with the checkpoint of a record in
// flight. Expiry is decided by the database's clock; p.Now is ignored.
func (s *Store) Get(ctx context.Context, p idemstore.GetParams) (idemstore.RecordInfo, error) {
	if p.ID != "" {
		return idemstore.RecordInfo{}, errNoID
	}
	var (
		fp               string
		leaseEnd         sql.NullInt64
		expiresAt        int64
		resp, checkpoint []byte
	)
	err := s.db.QueryRowContext(ctx, `SELECT fingerprint, `+micros("lease_expires_at")+`, `+micros("expires_at")+`, response, checkpoint FROM `+s.table+
		" WHERE scope = ? AND `key` = ? AND expires_at > "+now, p.Scope, p.Key).
		Scan(&fp, &leaseEnd, &expiresAt, &resp, &checkpoint)
	if errors.Is(err, sql.ErrNoRows) {
		return idemstore.RecordInfo{}, idemstore.ErrNotFound
	}
	if err != nil {
		return idemstore.RecordInfo{}, fmt.Errorf("mysqlstore: get: %w", err)
	}
	ri := info(p.Scope, p.Key, fp, leaseEnd, expiresAt, len(resp), resp != nil)
	if resp != nil {
		ri.Response = new(idemstore.Response)
		if err := ri.Response.UnmarshalBinary(resp); err != nil {
			return idemstore.RecordInfo{}, fmt.Errorf("mysqlstore: get: stored response: %w", err)
		}
	} else if len(checkpoint) > 0 {
		ri.Checkpoint = checkpoint
	}
	return ri, nil
}

func info(scope, key, fp string, leaseEnd sql.NullInt64, expiresAt int64, size int, completed bool) idemstore.RecordInfo {
	ri := idemstore.RecordInfo{Scope: scope, Key: key, ResponseSize: size, Record: idemstore.Record{
		State: idemstore.StateInFlight, Fingerprint: fp, ExpiresAt: fromMicros(expiresAt)}}
	if completed {
		ri.State = idemstore.StateCompleted
	} else if leaseEnd.Valid {
		ri.LeaseExpiresAt = fromMicros(leaseEnd.Int64)
	}
	return ri
}

// List implements idemstore.Inspector; records come in (Scope, Key) order
// of their bytes (the columns are VARBINARY). Each page is one range scan
// of the primary key from After, stopped after Limit+1 rows (the one more
// tells whether another page follows); a State or Key filter skips rows on
// that scan instead of sorting anything.
func (s *Store) List(ctx context.Context, p idemstore.ListParams) (idemstore.ListPage, error) {
	q, args, err := s.listQuery(p)
	if err != nil {
		return idemstore.ListPage{}, fmt.Errorf("mysqlstore: list: %w", err)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return idemstore.ListPage{}, fmt.Errorf("mysqlstore: list: %w", err)
	}
	defer rows.Close()
	var (
		page           idemstore.ListPage
		scope, key, fp string
		leaseEnd       sql.NullInt64
		expiresAt      int64
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
			return idemstore.ListPage{}, fmt.Errorf("mysqlstore: list: %w", err)
		}
		page.Records = append(page.Records, info(scope, key, fp, leaseEnd, expiresAt, size, completed))
	}
	if err := rows.Close(); err != nil {
		return idemstore.ListPage{}, fmt.Errorf("mysqlstore: list: %w", err)
	}
	if err := rows.Err(); err != nil {
		return idemstore.ListPage{}, fmt.Errorf("mysqlstore: list: %w", err)
	}
	return page, nil
}

// listQuery returns List's statement and arguments for p.
func (s *Store) listQuery(p idemstore.ListParams) (string, []any, error) {
	if p.Limit <= 0 {
		return "", nil, errors.New("the limit must be positive")
	}
	var b strings.Builder
	b.WriteString(`SELECT scope, ` + "`key`" + `, fingerprint, ` + micros("lease_expires_at") + `, ` + micros("expires_at") +
		`, response IS NOT NULL, COALESCE(LENGTH(response), 0) FROM ` + s.table + ` WHERE expires_at > ` + now)
	var args []any
	if p.After != "" {
		scope, key, err := idemstore.ParseListCursor(p.After)
		if err != nil {
			return "", nil, err
		}
		// Written out rather than as a row comparison, which MariaDB's
		// range optimiser does not turn into an index range.
		b.WriteString(" AND (scope > ? OR (scope = ? AND `key` > ?))")
		args = append(args, scope, scope, key)
	}
	switch p.State {
	case idemstore.StateInFlight:
		b.WriteString(` AND token IS NOT NULL`)
	case idemstore.StateCompleted:
		b.WriteString(` AND token IS NULL`)
	}
	if p.Key != "" {
		b.WriteString(" AND `key` = ?")
		args = append(args, p.Key)
	}
	b.WriteString(" ORDER BY scope, `key` LIMIT ?")
	args = append(args, int64(min(p.Limit, math.MaxInt32-1)+1))
	return b.String(), args, nil
}

// deleteLockWait bounds how long Delete waits for a record that another
// transaction holds (whole seconds: InnoDB's granularity).
const deleteLockWait = "1"

// Delete implements idemstore.Inspector: one DELETE of the live record,
// restricted to a completed one unless p.Force is set; when it deletes
// nothing, a read tells why.
func (s *Store) Delete(ctx context.Context, p idemstore.DeleteParams) error {
	if p.ID != "" {
		return errNoID
	}
	q := "SET STATEMENT innodb_lock_wait_timeout = " + deleteLockWait + " FOR DELETE FROM " + s.table +
		" WHERE scope = ? AND `key` = ? AND expires_at > " + now
	if !p.Force {
		q += " AND token IS NULL"
	}
	res, err := s.db.ExecContext(ctx, q, p.Scope, p.Key)
	if err != nil {
		return fmt.Errorf("mysqlstore: delete: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("mysqlstore: delete: %w", err)
	} else if n == 1 {
		return nil
	}
	var inFlight bool
	err = s.db.QueryRowContext(ctx, "SELECT token IS NOT NULL FROM "+s.table+" WHERE scope = ? AND `key` = ? AND expires_at > "+now, p.Scope, p.Key).Scan(&inFlight)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return idemstore.ErrNotFound
	case err != nil:
		return fmt.Errorf("mysqlstore: delete: %w", err)
	case inFlight && !p.Force:
		return idemstore.ErrInFlight
	}
	return fmt.Errorf("mysqlstore: delete: the record changed during the delete; try again")
}
