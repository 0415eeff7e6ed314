package redisstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// GetByID and DeleteByID find a record by the Redis key List names it by,
// refuse an in-flight one without force, and refuse ids that are not this
// store's record keys.
func TestByID(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	p := idemstore.ClaimParams{Scope: idem.Scope("t", "POST /x"), Key: "k1", Fingerprint: fpA, Token: "tok",
		Lease: time.Minute, TTL: time.Hour, Now: time.Now()}
	mustAcquire(t, s, p)
	id := s.Key(p.Scope, p.Key)
	ri, err := s.GetByID(ctx, id)
	if err != nil || ri.State != idemstore.StateInFlight || ri.ID != id || ri.Fingerprint != fpA {
		t.Fatalf("GetByID of an in-flight record = %+v, %v", ri, err)
	}
	if err := s.DeleteByID(ctx, id, false); !errors.Is(err, idemstore.ErrInFlight) {
		t.Fatalf("DeleteByID of an in-flight record without force: %v, want ErrInFlight", err)
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token,
		Response: &idemstore.Response{StatusCode: 201, Body: []byte("ok")}}); err != nil {
		t.Fatal(err)
	}
	ri, err = s.GetByID(ctx, id)
	if err != nil || ri.State != idemstore.StateCompleted || ri.Response == nil || string(ri.Response.Body) != "ok" {
		t.Fatalf("GetByID of a completed record = %+v, %v", ri, err)
	}
	if err := s.DeleteByID(ctx, id, false); err != nil {
		t.Fatalf("DeleteByID: %v", err)
	}
	if _, err := s.GetByID(ctx, id); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("GetByID after delete: %v, want ErrNotFound", err)
	}
	if err := s.DeleteByID(ctx, id, false); !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("DeleteByID after delete: %v, want ErrNotFound", err)
	}
	for _, bad := range []string{"", "other:{" + id[len(id)-65:], id + "x", "idem:{zz}"} {
		if _, err := s.GetByID(ctx, bad); err == nil || errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("GetByID(%q) = %v, want a refusal", bad, err)
		}
		if err := s.DeleteByID(ctx, bad, true); err == nil || errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("DeleteByID(%q) = %v, want a refusal", bad, err)
		}
	}
}
