package storetest

import (
	"errors"
	"testing"

	"github.com/idemhq/idem/idemstore"
)

func testFencing(t *testing.T, h Harness) {
	t.Run("WrongTokenChangesNothing", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		intruder := b.other(p)
		if err := b.renew(intruder); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Renew with a wrong token: %v, want ErrLeaseLost", err)
		}
		if err := b.complete(intruder, sampleResponse()); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Complete with a wrong token: %v, want ErrLeaseLost", err)
		}
		if err := b.release(intruder); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Release with a wrong token: %v, want ErrLeaseLost", err)
		}
		b.mustOutcome(b.other(p), idemstore.ClaimInFlight)
		if err := b.renew(p); err != nil {
			t.Errorf("owner Renew: %v", err)
		}
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Errorf("owner Complete: %v", err)
		}
	})

	t.Run("CompletedRecordIsFinal", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		want := sampleResponse()
		if err := b.complete(p, want); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		other := &idemstore.Response{StatusCode: 500, Body: []byte("overwritten")}
		if err := b.complete(p, other); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("second Complete: %v, want ErrLeaseLost", err)
		}
		if err := b.release(p); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Release after Complete: %v, want ErrLeaseLost", err)
		}
		if err := b.renew(p); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Renew after Complete: %v, want ErrLeaseLost", err)
		}
		r := b.mustOutcome(b.other(p), idemstore.ClaimCompleted)
		if d := sameResponse(r.Record.Response, want); d != "" {
			t.Errorf("response after refused transitions: %s", d)
		}
	})

	t.Run("ReleasedRecordIsGone", func(t *testing.T) {
		b := setup(t, h)
		p := b.acquire(fpA)
		if err := b.release(p); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := b.complete(p, sampleResponse()); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Complete after Release: %v, want ErrLeaseLost", err)
		}
		if err := b.release(p); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("second Release: %v, want ErrLeaseLost", err)
		}
		if err := b.renew(p); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Renew after Release: %v, want ErrLeaseLost", err)
		}
	})

	t.Run("UnknownRecord", func(t *testing.T) {
		b := setup(t, h)
		scope, key := b.names()
		p := b.claimParams(scope, key, fpA)
		if err := b.renew(p); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Renew of an unknown record: %v, want ErrLeaseLost", err)
		}
		if err := b.complete(p, sampleResponse()); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Complete of an unknown record: %v, want ErrLeaseLost", err)
		}
		if err := b.release(p); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Release of an unknown record: %v, want ErrLeaseLost", err)
		}
		// None of them may have created the record.
		b.mustOutcome(p, idemstore.ClaimAcquired)
	})

	t.Run("StaleOwnerIsFenced", func(t *testing.T) {
		b := setup(t, h)
		stale := b.acquire(fpA)
		b.clock.Advance(b.lease + b.lease/4)
		successor := b.other(stale)
		r := b.takeOver(successor)
		if !r.TookOver {
			t.Error("take-over of an expired lease did not set TookOver")
		}
		if err := b.renew(stale); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("stale Renew: %v, want ErrLeaseLost", err)
		}
		if err := b.complete(stale, &idemstore.Response{StatusCode: 200, Body: []byte("stale")}); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("stale Complete: %v, want ErrLeaseLost", err)
		}
		if err := b.release(stale); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("stale Release: %v, want ErrLeaseLost", err)
		}
		want := sampleResponse()
		if err := b.complete(successor, want); err != nil {
			t.Fatalf("successor Complete: %v", err)
		}
		got := b.mustOutcome(b.other(stale), idemstore.ClaimCompleted)
		if d := sameResponse(got.Record.Response, want); d != "" {
			t.Errorf("stored response is not the successor's: %s", d)
		}
	})
}
