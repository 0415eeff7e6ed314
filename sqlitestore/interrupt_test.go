package sqlitestore_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/sqlitestore"
)

// A renewal inside the operation's transaction runs on the renewer's own
// goroutine, and the core cancels it when the operation returns. SQLite
// answers a write interrupted inside a transaction by rolling the whole
// transaction back, and the connection then runs every later statement in
// autocommit mode. Completing the record after that would commit the
// stored response alone, without the business writes it answers for (a
// payment answered "captured" whose row stays pending). The transaction
// must refuse to complete or commit instead.
func TestTxRefusesToCompleteAfterAnInterruptedRenewal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, filepath.Join(t.TempDir(), "idem.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	business(t, s)
	// The trigger makes a renewal's write slow enough to be cancelled
	// while it runs: it counts to a billion (seconds) before the update.
	if _, err := s.DB().Exec(`CREATE TRIGGER slow_renewal BEFORE UPDATE OF lease_until ON idem_records
		WHEN NEW.state = 1 AND OLD.state = 1
		BEGIN SELECT count(*) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT 1000000000) SELECT x FROM c); END`); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	cp := idemstore.ClaimParams{Scope: "s", Key: "k", Fingerprint: "fp", Token: "tok", Lease: time.Minute, TTL: time.Hour, Now: now}
	if _, err := s.Claim(ctx, cp); err != nil {
		t.Fatal(err)
	}
	tx, err := s.BeginTx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	native := tx.(interface{ Native() any }).Native().(*sql.Tx)
	if _, err := native.ExecContext(ctx, `INSERT INTO payments (id, note) VALUES (1, 'captured')`); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = tx.(idemstore.TxRenewer).Renew(rctx, idemstore.RenewParams{Scope: "s", Key: "k", Token: "tok", Lease: time.Minute, Now: now})
	cancel()
	if err == nil {
		t.Fatal("the slowed renewal was not interrupted; the test cannot tell anything")
	}
	cerr := tx.Complete(ctx, idemstore.CompleteParams{Scope: "s", Key: "k", Token: "tok", Now: now,
		Response: &idem.Response{StatusCode: 201, Body: []byte("captured")}})
	if cerr == nil {
		cerr = tx.Commit(ctx)
	}
	if cerr == nil {
		t.Error("Complete and Commit succeeded after the transaction was rolled back by the interrupted renewal")
	}
	rec, err := s.Get(ctx, idemstore.GetParams{Scope: "s", Key: "k", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if n := countPayments(t, s); rec.State == idemstore.StateCompleted && n == 0 {
		t.Errorf("the record is completed with its response, but the payment written in its transaction is gone (%d rows)", n)
	}
}
