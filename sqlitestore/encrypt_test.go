package sqlitestore_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/idemhq/idem/storetest"
)

func TestConformanceEncrypted(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		NewStore: func(t *testing.T) idemstore.Store {
			s, _ := open(t)
			return s
		},
		DeferredTakeOver: true,
		Encryption:       storetest.Encryption(t),
	})
}

func TestEncryptionAtRest(t *testing.T) {
	storetest.RunAtRest(t, storetest.AtRestHarness{
		NewStore: func(t *testing.T) (idemstore.Store, storetest.Raw) {
			s, path := open(t)
			return s, sqliteRaw{db: s.DB(), path: path}
		},
	})
}

// sqliteRaw reads the database files themselves and writes through SQL.
type sqliteRaw struct {
	db   *sql.DB
	path string
}

// Dump returns the bytes of the database file and of its write-ahead log,
// where recent pages live until a checkpoint.
func (r sqliteRaw) Dump(t *testing.T) []byte {
	t.Helper()
	var all []byte
	for _, p := range []string{r.path, r.path + "-wal"} {
		b, err := os.ReadFile(p)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	if len(all) == 0 {
		t.Fatalf("no database files at %s", filepath.Dir(r.path))
	}
	return all
}

func (r sqliteRaw) Response(t *testing.T, scope, key string) []byte {
	t.Helper()
	var b []byte
	err := r.db.QueryRowContext(context.Background(),
		`SELECT response FROM `+sqlitestore.DefaultTable+` WHERE scope = ? AND key = ?`, scope, key).Scan(&b)
	if err == sql.ErrNoRows {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (r sqliteRaw) SetResponse(t *testing.T, scope, key string, b []byte) {
	t.Helper()
	res, err := r.db.ExecContext(context.Background(),
		`UPDATE `+sqlitestore.DefaultTable+` SET response = ? WHERE scope = ? AND key = ?`, b, scope, key)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("SetResponse updated %d rows", n)
	}
}

// Checkpoint and SetCheckpoint implement storetest.RawCheckpoints.
func (r sqliteRaw) Checkpoint(t *testing.T, scope, key string) []byte {
	t.Helper()
	var b []byte
	err := r.db.QueryRowContext(context.Background(),
		`SELECT checkpoint FROM `+sqlitestore.DefaultTable+` WHERE scope = ? AND key = ?`, scope, key).Scan(&b)
	if err == sql.ErrNoRows {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (r sqliteRaw) SetCheckpoint(t *testing.T, scope, key string, b []byte) {
	t.Helper()
	res, err := r.db.ExecContext(context.Background(),
		`UPDATE `+sqlitestore.DefaultTable+` SET checkpoint = ? WHERE scope = ? AND key = ?`, b, scope, key)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("SetCheckpoint updated %d rows", n)
	}
}
