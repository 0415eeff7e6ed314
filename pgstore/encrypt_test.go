package pgstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/storetest"
	"github.com/jackc/pgx/v5"
)

func TestConformanceEncrypted(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, mode string) {
		storetest.Run(t, storetest.Harness{
			NewStore:    func(t *testing.T) idemstore.Store { return newFixtureIn(t, mode, nil).store },
			ServerClock: true,
			Encryption:  storetest.Encryption(t),
		})
	})
}

func TestEncryptionAtRest(t *testing.T) {
	t.Parallel()
	eachMode(t, func(t *testing.T, mode string) {
		storetest.RunAtRest(t, storetest.AtRestHarness{
			NewStore: func(t *testing.T) (idemstore.Store, storetest.Raw) {
				f := newFixtureIn(t, mode, nil)
				return f.store, pgRaw{f}
			},
		})
	})
}

// pgRaw reads and writes the records table with pgx, as a database login
// or a restored backup would.
type pgRaw struct{ f *fixture }

func (r pgRaw) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Dump returns every column of every row, the bytea column as its bytes.
func (r pgRaw) Dump(t *testing.T) []byte {
	t.Helper()
	rows, err := r.f.pool.Query(r.ctx(t), `SELECT scope, key, fingerprint, coalesce(token, ''), coalesce(response, ''::bytea),
		coalesce(checkpoint, ''::bytea), expires_at::text, coalesce(lease_expires_at::text, ''), attempt::text, fence::text FROM `+r.f.table)
	if err != nil {
		t.Fatal(err)
	}
	var all []byte
	for rows.Next() {
		var scope, key, fp, token, exp, lease, attempt, fence string
		var resp, checkpoint []byte
		if err := rows.Scan(&scope, &key, &fp, &token, &resp, &checkpoint, &exp, &lease, &attempt, &fence); err != nil {
			t.Fatal(err)
		}
		all = append(append(append(all, scope+key+fp+token+exp+lease+attempt+fence...), resp...), checkpoint...)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return all
}

func (r pgRaw) Response(t *testing.T, scope, key string) []byte {
	t.Helper()
	var b []byte
	err := r.f.pool.QueryRow(r.ctx(t), `SELECT response FROM `+r.f.table+` WHERE scope = $1 AND key = $2`, scope, key).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (r pgRaw) SetResponse(t *testing.T, scope, key string, b []byte) {
	t.Helper()
	if n := r.f.exec(t, `UPDATE `+r.f.table+` SET response = $1 WHERE scope = $2 AND key = $3`, b, scope, key); n != 1 {
		t.Fatalf("SetResponse updated %d rows", n)
	}
}

// Checkpoint and SetCheckpoint implement storetest.RawCheckpoints.
func (r pgRaw) Checkpoint(t *testing.T, scope, key string) []byte {
	t.Helper()
	var b []byte
	err := r.f.pool.QueryRow(r.ctx(t), `SELECT checkpoint FROM `+r.f.table+` WHERE scope = $1 AND key = $2`, scope, key).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (r pgRaw) SetCheckpoint(t *testing.T, scope, key string, b []byte) {
	t.Helper()
	if n := r.f.exec(t, `UPDATE `+r.f.table+` SET checkpoint = $1 WHERE scope = $2 AND key = $3`, b, scope, key); n != 1 {
		t.Fatalf("SetCheckpoint updated %d rows", n)
	}
}
