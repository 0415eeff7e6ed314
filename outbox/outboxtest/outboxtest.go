// Package outboxtest checks an outbox.Inspector implementation against
// its contract, with the standard library's testing only.
package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idemhq/idem/outbox"
)

// Store is an outbox store with the operator capability.
type Store interface {
	outbox.Store
	outbox.Inspector
}

// RunInspector checks s's Inspector methods. add must commit msgs to s's
// outbox (as an operation's transaction does); s must be empty.
func RunInspector(t *testing.T, s Store, add func(ctx context.Context, msgs ...outbox.Message) error) {
	t.Helper()
	ctx := context.Background()
	n, oldest, err := s.Backlog(ctx)
	if err != nil || n != 0 || oldest != nil {
		t.Fatalf("Backlog of an empty outbox = %d, %v, %v", n, oldest, err)
	}
	before := time.Now().Add(-time.Second)
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, outbox.Message{ID: fmt.Sprintf("m%d", i), Topic: "t.created", Key: "k",
			Payload: []byte(fmt.Sprintf(`{"n":%d}`, i)), Headers: map[string]string{"Event-Type": "created"}})
	}
	if err := add(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	n, oldest, err = s.Backlog(ctx)
	if err != nil || n != 5 || oldest == nil || oldest.ID != "m0" || oldest.Payload != nil || oldest.Size != len(`{"n":0}`) ||
		oldest.CreatedAt.Before(before) || !oldest.ClaimedUntil.IsZero() {
		t.Fatalf("Backlog = %d, %+v, %v; want 5 with m0 oldest, unclaimed, without its payload", n, oldest, err)
	}

	// Paging in sequence order, payloads only when asked for.
	first, err := s.ListPending(ctx, outbox.ListPendingParams{Limit: 2})
	if err != nil || len(first) != 2 || first[0].ID != "m0" || first[1].ID != "m1" || first[0].Payload != nil {
		t.Fatalf("ListPending first page = %+v, %v", first, err)
	}
	next, err := s.ListPending(ctx, outbox.ListPendingParams{After: first[1].Seq, Limit: 10, WithPayload: true})
	if err != nil || len(next) != 3 || next[0].ID != "m2" || string(next[0].Payload) != `{"n":2}` || next[0].Headers["Event-Type"] != "created" {
		t.Fatalf("ListPending after %d = %+v, %v", first[1].Seq, next, err)
	}
	for _, limit := range []int{0, -1, outbox.MaxListLimit + 1} {
		if _, err := s.ListPending(ctx, outbox.ListPendingParams{Limit: limit}); err == nil {
			t.Errorf("ListPending with limit %d succeeded", limit)
		}
	}
	m, err := s.GetPending(ctx, first[0].Seq)
	if err != nil || m.ID != "m0" || string(m.Payload) != `{"n":0}` || m.Topic != "t.created" || m.Key != "k" {
		t.Fatalf("GetPending = %+v, %v", m, err)
	}

	// A claimed message shows its claim; RetryNow makes it claimable at
	// once by another owner.
	claimed, err := s.Claim(ctx, outbox.ClaimParams{Owner: "a", Limit: 1, Lease: time.Hour, Now: time.Now()})
	if err != nil || len(claimed) != 1 || claimed[0].ID != "m0" {
		t.Fatalf("Claim = %+v, %v", claimed, err)
	}
	if m, err := s.GetPending(ctx, claimed[0].Seq); err != nil || m.ClaimedUntil.Before(time.Now().Add(50*time.Minute)) || m.Attempts != 1 {
		t.Fatalf("GetPending of a claimed message = %+v, %v; want its claim for an hour and one attempt", m, err)
	}
	if got, err := s.Claim(ctx, outbox.ClaimParams{Owner: "b", Limit: 1, Lease: time.Hour, Now: time.Now()}); err != nil || len(got) != 0 {
		t.Fatalf("Claim by b while a holds the key's first message = %+v, %v; want none", got, err)
	}
	if err := s.RetryNow(ctx, claimed[0].Seq); err != nil {
		t.Fatalf("RetryNow: %v", err)
	}
	if got, err := s.Claim(ctx, outbox.ClaimParams{Owner: "b", Limit: 1, Lease: time.Hour, Now: time.Now()}); err != nil || len(got) != 1 || got[0].ID != "m0" {
		t.Fatalf("Claim by b after RetryNow = %+v, %v; want m0", got, err)
	}
	if err := s.MarkSent(ctx, "b", []int64{claimed[0].Seq}); err != nil {
		t.Fatal(err)
	}
	if err := s.RetryNow(ctx, claimed[0].Seq); !errors.Is(err, outbox.ErrNotPending) {
		t.Errorf("RetryNow of a sent message: %v, want ErrNotPending", err)
	}
	if _, err := s.GetPending(ctx, claimed[0].Seq); !errors.Is(err, outbox.ErrNotPending) {
		t.Errorf("GetPending of a sent message: %v, want ErrNotPending", err)
	}
	if err := s.RetryNow(ctx, 1<<40); !errors.Is(err, outbox.ErrNotPending) {
		t.Errorf("RetryNow of an unknown message: %v, want ErrNotPending", err)
	}
	if n, oldest, err := s.Backlog(ctx); err != nil || n != 4 || oldest == nil || oldest.ID != "m1" {
		t.Errorf("Backlog after m0 was sent = %d, %+v, %v; want 4 with m1 oldest", n, oldest, err)
	}
}
