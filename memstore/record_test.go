package memstore

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/idemhq/idem/idemstore"
)

// TestRecordFitsMapSlot checks the bound in record's comment: beyond 128
// bytes the map holds each record through a pointer, an allocation and an
// object per record.
func TestRecordFitsMapSlot(t *testing.T) {
	t.Parallel()
	if n := unsafe.Sizeof(record{}); n > 128 {
		t.Fatalf("record is %d bytes, want at most 128", n)
	}
}

// TestCompletedRecordIsOneAllocation checks that a completed record's map
// key, fingerprint and response all live in its data, and still read as
// the claim named them.
func TestCompletedRecordIsOneAllocation(t *testing.T) {
	t.Parallel()
	s, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, now := context.Background(), time.Unix(1_700_000_000, 0)
	cp := idemstore.ClaimParams{Scope: "0:|POST /x", Key: "key-1", Fingerprint: "v1:abc", Token: "tok", Lease: time.Minute, TTL: time.Hour, Now: now}
	if _, err := s.Claim(ctx, cp); err != nil {
		t.Fatal(err)
	}
	resp := &idemstore.Response{StatusCode: 201, Body: []byte(`{"ok":true}`)}
	if err := s.Complete(ctx, idemstore.CompleteParams{Scope: cp.Scope, Key: cp.Key, Token: cp.Token, Response: resp, Now: now}); err != nil {
		t.Fatal(err)
	}
	k := recordKey{cp.Scope, cp.Key}
	sh := s.shard(k)
	var (
		stored recordKey
		r      record
		n      int
	)
	for sk, sr := range sh.records {
		stored, r, n = sk, sr, n+1
	}
	if n != 1 || stored != k {
		t.Fatalf("shard holds %d records, last %+v; want only %+v", n, stored, k)
	}
	within := func(what, s string) {
		t.Helper()
		p, lo := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.SliceData(r.data)))
		if p < lo || p+uintptr(len(s)) > lo+uintptr(len(r.data)) {
			t.Errorf("%s %q is not a view of the record's data", what, s)
		}
	}
	within("map key", stored.key)
	within("fingerprint", r.fp(stored))
	if r.fp(stored) != cp.Fingerprint || r.fingerprint != "" || r.token != "" {
		t.Errorf("fingerprint %q (field %q), token %q; want %q, none and none", r.fp(stored), r.fingerprint, r.token, cp.Fingerprint)
	}
	cr, err := s.Claim(ctx, cp)
	if err != nil || cr.Outcome != idemstore.ClaimCompleted || cr.Record.Response == nil || string(cr.Record.Response.Body) != `{"ok":true}` || cr.Record.Response.StatusCode != 201 {
		t.Fatalf("claim after complete = %+v, %v", cr, err)
	}
}
