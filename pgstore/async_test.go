package pgstore_test

import (
	"context"
	"testing"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestAsyncClaimDoesNotLeak checks that the asynchronous commit applies to
// the claim's own transaction only: the connection's next statement (a
// completion, a business transaction) commits synchronously again.
func TestAsyncClaimDoesNotLeak(t *testing.T) {
	t.Parallel()
	f := newFixture(t, &pgstore.Config{AsyncClaim: true})
	// A pool of one connection, so that the check below runs on the
	// connection the claim used.
	cfg := f.pool.Config().Copy()
	cfg.MaxConns, cfg.MinConns = 1, 0
	one, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	store, err := pgstore.New(context.Background(), one, &pgstore.Config{Schema: f.schema, AsyncClaim: true, SkipMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	r, err := store.Claim(context.Background(), claimParams("s", "k"))
	if err != nil || r.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("claim: %v %v", r.Outcome, err)
	}
	var setting string
	if err := one.QueryRow(context.Background(), "SHOW synchronous_commit").Scan(&setting); err != nil {
		t.Fatal(err)
	}
	if setting != "on" {
		t.Fatalf("synchronous_commit after an asynchronous claim: %q, want on", setting)
	}
}
