package console

import (
	"context"
	"testing"
	"time"

	"github.com/idemhq/idem/pgstore"
)

// The overview's counts and its oldest lease on both SQL stores, over the
// seeded table: 19 records in flight (6 with a live lease, 6 suspended, 7
// abandoned; record 0's retention ends as it is seeded), the oldest lease
// moved two hours back. PostgreSQL reads them
// in one statement, SQLite in two.
func TestSummaryOnSQLStores(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			s := be.open(t)
			if s.PG == nil && s.SQLite == nil {
				t.Skip("not a SQL store")
			}
			seedSQL(t, s, 20_000)
			ctx := context.Background()
			oldest := benchKey(5000)
			var src *sqlSource
			if s.PG != nil {
				src = newPGSource(s.Records.(*pgstore.Store), s.PG)
				if _, err := s.PG.Exec(ctx, "UPDATE "+src.table+" SET lease_expires_at = now() - interval '2 hours' WHERE key = $1", oldest); err != nil {
					t.Fatal(err)
				}
			} else {
				src = newSQLiteSource(s.SQLite)
				if _, err := s.SQLite.DB().ExecContext(ctx, "UPDATE "+src.table+" SET lease_until = ? WHERE key = ?",
					time.Now().Add(-2*time.Hour).UnixNano(), oldest); err != nil {
					t.Fatal(err)
				}
			}
			sum, err := src.Summary(ctx, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			if sum.InFlight != 19 || sum.LeaseLive != 6 || sum.Suspended != 6 || sum.Abandoned != 7 || sum.Capped {
				t.Errorf("in flight %d, live %d, suspended %d, abandoned %d, capped %v; want 19, 6, 6, 7, false",
					sum.InFlight, sum.LeaseLive, sum.Suspended, sum.Abandoned, sum.Capped)
			}
			if sum.Oldest == nil || sum.Oldest.Key != oldest || sum.Oldest.LeaseExpiresAt.After(time.Now().Add(-time.Hour)) {
				t.Errorf("oldest lease: %+v, want %s's, two hours ago", sum.Oldest, oldest)
			}
		})
	}
}
