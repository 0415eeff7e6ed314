package mysqlstore_test

import (
	"fmt"
	"testing"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/mysqlstore"
	"github.com/idemhq/idem/storetest"
)

// The whole contract holds with server-side prepared statements (the
// driver's default) and with client-side interpolation
// (interpolateParams=true), and with duplicates answered by a read before
// any insert (Config.ReadFirst).
func TestConformance(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		interpolate bool
		cfg         *mysqlstore.Config
		alwaysRead  bool // a ReadFirst store pinned to reading first
	}{
		{"prepared", false, nil, false},
		{"interpolated", true, nil, false},
		{"read-first", true, &mysqlstore.Config{ReadFirst: true}, false},
		{"read-first/read", true, &mysqlstore.Config{ReadFirst: true}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, storetest.Harness{
				NewStore: func(t *testing.T) idemstore.Store {
					s := newFixtureOn(t, sharedDB(t, c.interpolate), c.cfg).store
					if c.alwaysRead {
						mysqlstore.PinReadFirst(s)
					}
					return s
				},
				ServerClock: true,
			})
		})
	}
}

// TestReadFirstFollowsTraffic: a ReadFirst store inserts first while most
// recent claims were of new keys and reads first once most met a record,
// for Claim and ClaimTx alike; every answer is right on either path.
func TestReadFirstFollowsTraffic(t *testing.T) {
	t.Parallel()
	for _, inTx := range []bool{false, true} {
		t.Run(map[bool]string{false: "claim", true: "claim-tx"}[inTx], func(t *testing.T) {
			t.Parallel()
			s := newFixtureOn(t, sharedDB(t, true), &mysqlstore.Config{ReadFirst: true}).store
			claim := func(key string, want idemstore.ClaimOutcome) idemstore.ClaimResult {
				t.Helper()
				p := claimParams("scope", key)
				if !inTx {
					return mustClaim(t, s, p, want)
				}
				r, tx, err := s.ClaimTx(t.Context(), p)
				if err != nil {
					t.Fatalf("ClaimTx(%q): %v", key, err)
				}
				if r.Outcome != want {
					t.Fatalf("ClaimTx(%q) = %v, want %v", key, r.Outcome, want)
				}
				if tx != nil {
					if err := tx.Commit(t.Context()); err != nil {
						t.Fatalf("Commit of %q's claim: %v", key, err)
					}
				}
				return r
			}
			if mysqlstore.ReadsFirst(s) {
				t.Fatal("a new store reads before its first insert")
			}
			for i := range 10 {
				claim(fmt.Sprintf("a-%d", i), idemstore.ClaimAcquired)
			}
			done := claimParams("scope", "done")
			mustClaim(t, s, done, idemstore.ClaimAcquired)
			if err := s.Complete(t.Context(), idemstore.CompleteParams{Scope: done.Scope, Key: done.Key, Token: done.Token,
				Response: &idemstore.Response{StatusCode: 201, Body: []byte("stored")}}); err != nil {
				t.Fatal(err)
			}
			for replays := 0; !mysqlstore.ReadsFirst(s); replays++ {
				if replays > 100 {
					t.Fatal("100 replays in a row did not make the store read first")
				}
				if r := claim("done", idemstore.ClaimCompleted); string(r.Record.Response.Body) != "stored" {
					t.Fatalf("replayed %q", r.Record.Response.Body)
				}
			}
			// Reading first now: replays, in-flight keys and new keys are
			// still answered right.
			claim("done", idemstore.ClaimCompleted)
			claim("a-0", idemstore.ClaimInFlight)
			for news := 0; mysqlstore.ReadsFirst(s); news++ {
				if news > 100 {
					t.Fatal("100 new keys in a row did not make the store insert first again")
				}
				claim(fmt.Sprintf("b-%d", news), idemstore.ClaimAcquired)
			}
		})
	}
}
