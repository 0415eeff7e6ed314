package storetest

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
)

// testInspect checks the optional idemstore.Inspector capability.
func testInspect(t *testing.T, h Harness) {
	inspector := func(t *testing.T) (*bundle, idemstore.Inspector) {
		b := setup(t, h)
		in, ok := b.store.(idemstore.Inspector)
		if !ok {
			t.Skip("the store does not implement idemstore.Inspector")
		}
		return b, in
	}
	get := func(b *bundle, in idemstore.Inspector, p idemstore.ClaimParams) (idemstore.RecordInfo, error) {
		return in.Get(b.ctx, idemstore.GetParams{Scope: p.Scope, Key: p.Key, Now: b.clock.Now()})
	}

	t.Run("GetInFlightAndCompleted", func(t *testing.T) {
		b, in := inspector(t)
		p := b.acquire(fpA)
		ri, err := get(b, in, p)
		if err != nil {
			t.Fatalf("Get in flight: %v", err)
		}
		if ri.State != idemstore.StateInFlight || ri.Fingerprint != fpA || ri.Response != nil || ri.ResponseSize != 0 {
			t.Errorf("Get in flight = %+v", ri)
		}
		if ri.Scope != p.Scope || ri.Key != p.Key || ri.FingerprintVersion() != idem.FingerprintVersion {
			t.Errorf("Get in flight: scope %q key %q version %q", ri.Scope, ri.Key, ri.FingerprintVersion())
		}
		b.near("LeaseExpiresAt", ri.LeaseExpiresAt, p.Now.Add(b.lease))
		b.near("ExpiresAt", ri.ExpiresAt, p.Now.Add(b.ttl))

		resp := sampleResponse()
		if err := b.complete(p, resp); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		ri, err = get(b, in, p)
		if err != nil {
			t.Fatalf("Get completed: %v", err)
		}
		if ri.State != idemstore.StateCompleted || !ri.LeaseExpiresAt.IsZero() {
			t.Errorf("Get completed: state %v, lease %v", ri.State, ri.LeaseExpiresAt)
		}
		// Get shows what the store holds: with Harness.Encryption, the
		// sealed response, which opens to the one completed.
		opened := b.open(p, idemstore.ClaimResult{Record: idemstore.Record{Response: ri.Response}}).Record.Response
		if d := sameResponse(opened, resp); d != "" {
			t.Errorf("Get completed: response: %s", d)
		}
		if want := b.seal(p, resp).EncodedSize(); ri.ResponseSize != want {
			t.Errorf("ResponseSize = %d, want %d", ri.ResponseSize, want)
		}
	})

	t.Run("GetCheckpoint", func(t *testing.T) {
		b, in := inspector(t)
		ss, ok := b.store.(idemstore.StepStore)
		if !ok {
			t.Skip("the store does not implement idemstore.StepStore")
		}
		p := b.acquire(fpA)
		// Binary, as a sealed checkpoint is: a zero byte, invalid UTF-8.
		cp := []byte("\x00idemcp1\xff\xfe{not json}\x00")
		if err := ss.SaveCheckpoint(b.ctx, idemstore.SaveCheckpointParams{Scope: p.Scope, Key: p.Key, Token: p.Token,
			Checkpoint: cp, Now: b.clock.Now()}); err != nil {
			t.Fatalf("SaveCheckpoint: %v", err)
		}
		ri, err := get(b, in, p)
		if err != nil {
			t.Fatalf("Get in flight: %v", err)
		}
		if !bytes.Equal(ri.Checkpoint, cp) {
			t.Errorf("Get in flight: checkpoint %q, want %q", ri.Checkpoint, cp)
		}
		if err := b.complete(p, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if ri, err = get(b, in, p); err != nil || ri.Checkpoint != nil {
			t.Errorf("Get completed: checkpoint %q, %v; want none", ri.Checkpoint, err)
		}
	})

	t.Run("GetAbsent", func(t *testing.T) {
		b, in := inspector(t)
		scope, key := b.names()
		if _, err := in.Get(b.ctx, idemstore.GetParams{Scope: scope, Key: key, Now: b.clock.Now()}); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("Get of an absent record: %v, want ErrNotFound", err)
		}
		// Another scope's record with the same key stays invisible.
		p := b.acquire(fpA)
		if _, err := in.Get(b.ctx, idemstore.GetParams{Scope: p.Scope + "x", Key: p.Key, Now: b.clock.Now()}); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("Get in another scope: %v, want ErrNotFound", err)
		}
	})

	t.Run("GetExpired", func(t *testing.T) {
		if h.ServerClock {
			t.Skip("letting a retention pass on a server clock is covered by Expiry")
		}
		b, in := inspector(t)
		p := b.acquire(fpA)
		b.clock.Advance(b.ttl + b.lease)
		if _, err := get(b, in, p); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("Get of an expired record: %v, want ErrNotFound", err)
		}
		if err := in.Delete(b.ctx, idemstore.DeleteParams{Scope: p.Scope, Key: p.Key, Force: true, Now: b.clock.Now()}); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("Delete of an expired record: %v, want ErrNotFound", err)
		}
	})

	t.Run("List", func(t *testing.T) {
		b, in := inspector(t)
		// Records that outlive the walks below on a server clock: a shared
		// Redis may hold many other keys, and every walk scans them too.
		running := b.longClaim(fpA)
		b.mustOutcome(running, idemstore.ClaimAcquired)
		done := b.longClaim(fpB)
		b.mustOutcome(done, idemstore.ClaimAcquired)
		if err := b.complete(done, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		list := func(p idemstore.ListParams) []idemstore.RecordInfo {
			t.Helper()
			p.Now = b.clock.Now()
			return walk(t, b, in, p)
		}
		all := list(idemstore.ListParams{Limit: 10})
		if len(all) != 2 {
			t.Fatalf("List = %d records, want 2", len(all))
		}
		for _, ri := range all {
			if ri.Response != nil {
				t.Error("List returned a response")
			}
			if want := b.seal(done, sampleResponse()).EncodedSize(); ri.State == idemstore.StateCompleted && ri.ResponseSize != want {
				t.Errorf("List: ResponseSize = %d, want %d", ri.ResponseSize, want)
			}
		}
		page, err := in.List(b.ctx, idemstore.ListParams{Limit: 1, Now: b.clock.Now()})
		if err != nil || len(page.Records) > 1 {
			t.Errorf("List with limit 1 = %d records, %v", len(page.Records), err)
		}
		for _, c := range []struct {
			state idemstore.RecordState
			want  idemstore.ClaimParams
		}{{idemstore.StateInFlight, running}, {idemstore.StateCompleted, done}} {
			got := list(idemstore.ListParams{State: c.state, Limit: 10})
			if len(got) != 1 || got[0].State != c.state {
				t.Fatalf("List(%v) = %+v", c.state, got)
			}
			if !h.HashedKeys && (got[0].Scope != c.want.Scope || got[0].Key != c.want.Key) {
				t.Errorf("List(%v) = (%q, %q), want (%q, %q)", c.state, got[0].Scope, got[0].Key, c.want.Scope, c.want.Key)
			}
		}
		if h.HashedKeys {
			_, err := in.List(b.ctx, idemstore.ListParams{Key: done.Key, Limit: 10, Now: b.clock.Now()})
			if !errors.Is(err, idemstore.ErrKeySearchUnsupported) {
				t.Errorf("List by key on a store that keeps keys hashed: %v, want ErrKeySearchUnsupported", err)
			}
			return
		}
		got := list(idemstore.ListParams{Key: done.Key, Limit: 10})
		if len(got) != 1 || got[0].Key != done.Key {
			t.Errorf("List(key %q) = %+v", done.Key, got)
		}
	})

	t.Run("ListPages", func(t *testing.T) { testListPages(t, h) })
	t.Run("ListPagesUnderChurn", func(t *testing.T) { testListChurn(t, h) })
	t.Run("ListInvalidCursor", func(t *testing.T) {
		b, in := inspector(t)
		b.acquire(fpA)
		for _, c := range []string{"x", "k1.", "k1.!!", "r1.", "r1.AAAA", "k1.gA", " "} {
			_, err := in.List(b.ctx, idemstore.ListParams{After: c, Limit: 10, Now: b.clock.Now()})
			if !errors.Is(err, idemstore.ErrInvalidCursor) {
				t.Errorf("List after %q: %v, want ErrInvalidCursor", c, err)
			}
		}
	})

	t.Run("ByID", func(t *testing.T) {
		b, in := inspector(t)
		running := b.acquire(fpA)
		done := b.acquire(fpB)
		if err := b.complete(done, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		ri, err := get(b, in, running)
		if err != nil {
			t.Fatalf("Get: %v", err)
		}
		if ri.ID == "" {
			// Records named by scope and key only: an ID is refused.
			if _, err := in.Get(b.ctx, idemstore.GetParams{ID: "x", Now: b.clock.Now()}); !errors.Is(err, idemstore.ErrInvalidID) {
				t.Errorf("Get by ID on a store without IDs: %v, want ErrInvalidID", err)
			}
			if err := in.Delete(b.ctx, idemstore.DeleteParams{ID: "x", Force: true, Now: b.clock.Now()}); !errors.Is(err, idemstore.ErrInvalidID) {
				t.Errorf("Delete by ID on a store without IDs: %v, want ErrInvalidID", err)
			}
			if _, err := get(b, in, running); err != nil {
				t.Errorf("the refused Delete by ID removed a record: %v", err)
			}
			return
		}
		// Each ID List returns names its record for Get and Delete.
		ids := map[string]bool{}
		for _, r := range walk(t, b, in, idemstore.ListParams{Limit: 10, Now: b.clock.Now()}) {
			ids[r.ID] = true
			got, err := in.Get(b.ctx, idemstore.GetParams{ID: r.ID, Now: b.clock.Now()})
			if err != nil || got.ID != r.ID || got.State != r.State || got.Fingerprint != r.Fingerprint {
				t.Errorf("Get(ID %q) = %+v, %v; List said %+v", r.ID, got, err, r)
			}
			if r.State == idemstore.StateCompleted && got.Response == nil {
				t.Errorf("Get(ID %q) of a completed record has no response", r.ID)
			}
		}
		if !ids[ri.ID] || len(ids) != 2 {
			t.Fatalf("List returned IDs %v; Get of the in-flight record says %q", ids, ri.ID)
		}
		if err := in.Delete(b.ctx, idemstore.DeleteParams{ID: ri.ID, Now: b.clock.Now()}); !errors.Is(err, idemstore.ErrInFlight) {
			t.Errorf("Delete by ID of an in-flight record without Force: %v, want ErrInFlight", err)
		}
		if err := in.Delete(b.ctx, idemstore.DeleteParams{ID: ri.ID, Force: true, Now: b.clock.Now()}); err != nil {
			t.Errorf("Delete by ID with Force: %v", err)
		}
		if _, err := get(b, in, running); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("Get after Delete by ID: %v, want ErrNotFound", err)
		}
		if _, err := in.Get(b.ctx, idemstore.GetParams{ID: ri.ID, Now: b.clock.Now()}); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("Get by the ID of a deleted record: %v, want ErrNotFound", err)
		}
		for _, bad := range []string{"x", ri.ID + "0", strings.ToUpper(ri.ID)} {
			if _, err := in.Get(b.ctx, idemstore.GetParams{ID: bad, Now: b.clock.Now()}); !errors.Is(err, idemstore.ErrInvalidID) {
				t.Errorf("Get by ID %q: %v, want ErrInvalidID", bad, err)
			}
		}
	})

	t.Run("Delete", func(t *testing.T) {
		b, in := inspector(t)
		del := func(p idemstore.ClaimParams, force bool) error {
			return in.Delete(b.ctx, idemstore.DeleteParams{Scope: p.Scope, Key: p.Key, Force: force, Now: b.clock.Now()})
		}
		running := b.acquire(fpA)
		if err := del(running, false); !errors.Is(err, idemstore.ErrInFlight) {
			t.Fatalf("Delete in flight without Force: %v, want ErrInFlight", err)
		}
		if _, err := get(b, in, running); err != nil {
			t.Fatalf("the refused Delete removed the record: %v", err)
		}
		if err := del(running, true); err != nil {
			t.Fatalf("Delete in flight with Force: %v", err)
		}
		if _, err := get(b, in, running); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("Get after Delete: %v, want ErrNotFound", err)
		}
		// The fencing rule holds: the old owner can no longer complete.
		if err := b.complete(running, sampleResponse()); !errors.Is(err, idemstore.ErrLeaseLost) {
			t.Errorf("Complete by the owner of a deleted record: %v, want ErrLeaseLost", err)
		}

		done := b.acquire(fpA)
		if err := b.complete(done, sampleResponse()); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		if err := del(done, false); err != nil {
			t.Fatalf("Delete completed: %v", err)
		}
		// The key is new again, for any payload.
		q := b.other(done)
		q.Fingerprint = fpB
		b.mustOutcome(q, idemstore.ClaimAcquired)
		if err := del(b.other(b.acquire(fpA)), false); !errors.Is(err, idemstore.ErrInFlight) {
			t.Errorf("Delete of another in-flight record: %v, want ErrInFlight", err)
		}
		scope, key := b.names()
		if err := in.Delete(b.ctx, idemstore.DeleteParams{Scope: scope, Key: key, Force: true, Now: b.clock.Now()}); !errors.Is(err, idemstore.ErrNotFound) {
			t.Errorf("Delete of an absent record: %v, want ErrNotFound", err)
		}
	})
}
