package mysqlstore_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/storetest"
)

func TestConformanceEncrypted(t *testing.T) {
	t.Parallel()
	storetest.Run(t, storetest.Harness{
		NewStore:    func(t *testing.T) idemstore.Store { return newFixture(t, nil).store },
		ServerClock: true,
		Encryption:  storetest.Encryption(t),
	})
}

func TestEncryptionAtRest(t *testing.T) {
	t.Parallel()
	storetest.RunAtRest(t, storetest.AtRestHarness{
		NewStore: func(t *testing.T) (idemstore.Store, storetest.Raw) {
			f := newFixture(t, nil)
			return f.store, rawTable{f}
		},
	})
}

// rawTable reads and writes the records table with plain SQL, as a
// database login or a restored backup would.
type rawTable struct{ f *fixture }

func (r rawTable) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Dump returns every column of every row.
func (r rawTable) Dump(t *testing.T) []byte {
	t.Helper()
	rows, err := r.f.db.QueryContext(r.ctx(t), "SELECT scope, `key`, fingerprint, COALESCE(token, ''), COALESCE(response, ''), "+
		"COALESCE(checkpoint, ''), CAST(expires_at AS CHAR), COALESCE(CAST(lease_expires_at AS CHAR), ''), attempt, fence FROM "+r.f.table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var all []byte
	for rows.Next() {
		var cols [10][]byte
		dest := make([]any, len(cols))
		for i := range cols {
			dest[i] = &cols[i]
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatal(err)
		}
		for _, c := range cols {
			all = append(all, c...)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return all
}

func (r rawTable) column(t *testing.T, col, scope, key string) []byte {
	t.Helper()
	var b []byte
	err := r.f.db.QueryRowContext(r.ctx(t), "SELECT "+col+" FROM "+r.f.table+" WHERE scope = ? AND `key` = ?", scope, key).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (r rawTable) set(t *testing.T, col, scope, key string, b []byte) {
	t.Helper()
	if n := r.f.exec(t, "UPDATE "+r.f.table+" SET "+col+" = ? WHERE scope = ? AND `key` = ?", b, scope, key); n != 1 {
		t.Fatalf("set %s updated %d rows", col, n)
	}
}

func (r rawTable) Response(t *testing.T, scope, key string) []byte {
	return r.column(t, "response", scope, key)
}
func (r rawTable) SetResponse(t *testing.T, scope, key string, b []byte) {
	r.set(t, "response", scope, key, b)
}

// Checkpoint and SetCheckpoint implement storetest.RawCheckpoints.
func (r rawTable) Checkpoint(t *testing.T, scope, key string) []byte {
	return r.column(t, "checkpoint", scope, key)
}
func (r rawTable) SetCheckpoint(t *testing.T, scope, key string, b []byte) {
	r.set(t, "checkpoint", scope, key, b)
}
