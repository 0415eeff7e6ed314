package memstore

import (
	"bytes"
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/idemhq/idem/idemstore"
)

// completeForTest claims and completes key with a body of n bytes and a TTL of ttl,
// and returns the record as the shard holds it.
func completeForTest(t *testing.T, s *Store, key string, n int, ttl time.Duration) ([]byte, record) {
	t.Helper()
	ctx, now := context.Background(), time.Now()
	p := idemstore.ClaimParams{Scope: "s", Key: key, Fingerprint: "fp", Token: "tok-" + key, Lease: time.Minute, TTL: ttl, Now: now}
	if _, err := s.Claim(ctx, p); err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte{key[0]}, n)
	resp := &idemstore.Response{StatusCode: 201, Body: body}
	if err := s.Complete(ctx, idemstore.CompleteParams{Scope: "s", Key: key, Token: p.Token, Response: resp, Now: now}); err != nil {
		t.Fatal(err)
	}
	k := recordKey{"s", key}
	r := s.shard(k).records[k]
	return body, r
}

// TestArenaChunks checks how completed records' data are laid out: records
// of one shard and lifetime class share a chunk, back to back; another
// class, or a large record, gets memory of its own; later records leave
// earlier ones' bytes as they were; a sweep lets go of the current chunks.
func TestArenaChunks(t *testing.T) {
	s, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Keys of one shard.
	var keys []string
	for i := 0; len(keys) < 4; i++ {
		k := string(rune('a'+i%26)) + string(rune('a'+i/26))
		if s.shard(recordKey{"s", k}) == s.shard(recordKey{"s", "aa"}) {
			keys = append(keys, k)
		}
	}
	_, r1 := completeForTest(t, s, keys[0], 10, time.Hour)
	_, r2 := completeForTest(t, s, keys[1], 10, time.Hour)
	end1 := unsafe.Add(unsafe.Pointer(unsafe.SliceData(r1.data)), len(r1.data))
	if end1 != unsafe.Pointer(unsafe.SliceData(r2.data)) {
		t.Error("two records of one class and shard do not share a chunk")
	}
	if cap(r1.data) != len(r1.data) {
		t.Errorf("a record's data has capacity %d beyond its %d bytes", cap(r1.data), len(r1.data))
	}
	_, r3 := completeForTest(t, s, keys[2], 10, 10*time.Second)
	if p := unsafe.Pointer(unsafe.SliceData(r3.data)); p == unsafe.Add(unsafe.Pointer(unsafe.SliceData(r2.data)), len(r2.data)) {
		t.Error("a record of another lifetime class follows the first class's records")
	}
	body, r4 := completeForTest(t, s, keys[3], arenaMaxRecord+1, time.Hour)
	if cap(r4.data) != len(r4.data) || len(r4.data) <= arenaMaxRecord {
		t.Errorf("large record: len %d cap %d", len(r4.data), cap(r4.data))
	}
	readBack := func(key string, want []byte) {
		t.Helper()
		p := idemstore.ClaimParams{Scope: "s", Key: key, Fingerprint: "fp", Token: "other", Lease: time.Minute, TTL: time.Hour, Now: time.Now()}
		cr, err := s.Claim(context.Background(), p)
		if err != nil || cr.Outcome != idemstore.ClaimCompleted || cr.Record.Response == nil || !bytes.Equal(cr.Record.Response.Body, want) {
			t.Fatalf("%s reads back as %+v, %v", key, cr, err)
		}
	}
	readBack(keys[3], body)
	// The first records are intact after the others were written.
	readBack(keys[0], bytes.Repeat([]byte{keys[0][0]}, 10))
	readBack(keys[1], bytes.Repeat([]byte{keys[1][0]}, 10))
	if _, err := s.DeleteExpired(context.Background(), idemstore.DeleteExpiredParams{Now: time.Now(), Limit: 10}); err != nil {
		t.Fatal(err)
	}
	for i := range s.shards {
		for c := range s.shards[i].arena {
			if s.shards[i].arena[c] != nil {
				t.Fatalf("shard %d keeps a chunk of class %d after a sweep", i, c)
			}
		}
	}
}
