package console

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
)

// hold claims key in scope and saves a recovery point held for an
// operator, as the reconciler does when it gives up: three attempts, the
// first a day ago, and a charge step whose outcome is unknown.
func hold(t *testing.T, records idemstore.Store, scope, key string) {
	t.Helper()
	ss, ok := records.(idemstore.StepStore)
	if !ok {
		t.Skip("the store keeps no recovery points")
	}
	ctx := context.Background()
	r, err := records.Claim(ctx, idemstore.ClaimParams{Scope: scope, Key: key, Fingerprint: "v1:fp", Token: "tok-held",
		Lease: time.Hour, TTL: 48 * time.Hour, Now: time.Now()})
	if err != nil || r.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("claim: %v %v", r.Outcome, err)
	}
	since := time.Now().Add(-24 * time.Hour).UTC().Format(time.RFC3339Nano)
	cp := fmt.Sprintf(`{"v":1,"steps":[{"name":"charge","unknown":true}],"since":%q,"attempts":3,"held":true}`, since)
	if err := ss.SaveCheckpoint(ctx, idemstore.SaveCheckpointParams{Scope: scope, Key: key, Token: "tok-held",
		Checkpoint: []byte(cp), EndLease: true, Hold: true, Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

// A record that reconciliation gave up on shows as held, with why, and
// the held filter lists it alone (not the merely suspended one).
func TestHeldRecords(t *testing.T) {
	t.Parallel()
	for _, be := range backends {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			s := be.open(t)
			sd := seed(t, s, 2)
			hold(t, s.Records, sd.scope, "held-key")
			b := setup(t, s, nil)
			id := b.find(sd.scope, "held-key")

			code, body, _ := b.get("/records/" + id)
			if code != http.StatusOK {
				t.Fatalf("the held record's page = %d:\n%s", code, body)
			}
			for _, want := range []string{"held for an operator", `id="held-reason"`, "after 3 attempts without an outcome",
				"first recovery point saved 24h0m0s ago", "step &#34;charge&#34; ended with an unknown outcome"} {
				if !strings.Contains(body, want) {
					t.Errorf("the held record's page lacks %q:\n%s", want, body)
				}
			}

			code, body, _ = b.get("/records?state=held")
			if code != http.StatusOK {
				t.Fatalf("state=held = %d:\n%s", code, body)
			}
			ids := idRE.FindAllStringSubmatch(body, -1)
			if len(ids) != 1 || ids[0][1] != id {
				t.Errorf("state=held lists %v, want only the held record %s", ids, id)
			}
			if !strings.Contains(body, "held for an operator") {
				t.Errorf("the held list does not say held:\n%s", body)
			}
			if sd.susp != "" {
				susp := b.find(sd.scope, sd.susp)
				if strings.Contains(body, susp) {
					t.Errorf("state=held lists the suspended record %s", susp)
				}
				_, page, _ := b.get("/records/" + susp)
				if strings.Contains(page, `id="held-reason"`) {
					t.Errorf("the suspended record's page says it is held:\n%s", page)
				}
			}
		})
	}
}
