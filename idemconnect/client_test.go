package idemconnect_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemconnect"
	"github.com/idemhq/idem/idemstore"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// keysOf returns the Idempotency-Key values each run of the handler saw.
func (o *orders) keysOf(t *testing.T, runs int) []string {
	t.Helper()
	var keys []string
	for i := int64(1); i <= int64(runs); i++ {
		v, _ := o.keys.Load(i)
		ks, _ := v.([]string)
		if len(ks) != 1 {
			t.Fatalf("run %d saw keys %q", i, ks)
		}
		keys = append(keys, ks[0])
	}
	return keys
}

// The client interceptor gives a call a key, sends that same key on each of
// its retries (so the server answers the retry from its record, or runs
// the call once), and gives the next call a new one.
func TestClientKeepsOneKeyAcrossRetries(t *testing.T) {
	t.Parallel()
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, newStore(t), nil)
			c := b.client(t, createProc, append(p.opts, connect.WithInterceptors(idemconnect.NewClientInterceptor(
				&idemconnect.ClientOptions{MaxAttempts: 3, MaxRetryDelay: 20 * time.Millisecond})))...)
			b.orders.failN.Store(2)
			r, err := call(t, c, "", "kate")
			if err != nil {
				t.Fatalf("call through the client interceptor: %v", err)
			}
			if r.Msg.GetValue() == "" || b.orders.runs.Load() != 3 {
				t.Fatalf("reply %q after %d runs", r.Msg.GetValue(), b.orders.runs.Load())
			}
			keys := b.orders.keysOf(t, 3)
			if keys[0] != keys[1] || keys[1] != keys[2] {
				t.Errorf("the attempts carried different keys: %q", keys)
			}
			if k, err := idem.ParseKey(keys[:1]); err != nil || len(k) != 26 || keys[0] != `"`+k+`"` {
				t.Errorf("generated key %q: %v", keys[0], err)
			}
			if _, err := call(t, c, "", "kate"); err != nil || b.orders.runs.Load() != 4 {
				t.Errorf("second call: %v, %d runs", err, b.orders.runs.Load())
			}
			if b.orders.keysOf(t, 4)[3] == keys[0] {
				t.Error("the second call reused the first call's key")
			}
			// A key the caller chose is kept, and a retry of it replays.
			for range 2 {
				if _, err := call(t, c, "mine", "kate"); err != nil {
					t.Fatal(err)
				}
			}
			if k := b.orders.keysOf(t, 5)[4]; k != "mine" || b.orders.runs.Load() != 5 {
				t.Errorf("caller's key sent as %q, %d runs", k, b.orders.runs.Load())
			}
		})
	}
}

// The retries stop after MaxAttempts and never on a final answer.
func TestClientGivesUp(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), nil)
	c := b.client(t, createProc, connect.WithInterceptors(idemconnect.NewClientInterceptor(
		&idemconnect.ClientOptions{MaxAttempts: 2, MaxRetryDelay: time.Millisecond})))
	b.orders.failN.Store(5)
	if _, err := call(t, c, "", "liam"); connect.CodeOf(err) != connect.CodeUnavailable || b.orders.runs.Load() != 2 {
		t.Errorf("after 2 attempts: %v, %d runs", err, b.orders.runs.Load())
	}
	b.orders.failN.Store(0)
	if _, err := call(t, c, "", "missing"); connect.CodeOf(err) != connect.CodeNotFound || b.orders.runs.Load() != 3 {
		t.Errorf("NotFound: %v, %d runs", err, b.orders.runs.Load())
	}
}

// countingDown is a store that is down and counts the claims it refused.
type countingDown struct {
	idemstore.Store
	claims atomic.Int64
}

func (s *countingDown) Claim(context.Context, idemstore.ClaimParams) (idemstore.ClaimResult, error) {
	s.claims.Add(1)
	return idemstore.ClaimResult{}, errors.New("connection refused")
}

// A retry the call's deadline leaves no room for is not waited for: the
// server's error comes back at once.
func TestClientDoesNotWaitPastTheDeadline(t *testing.T) {
	t.Parallel()
	store := &countingDown{Store: newStore(t)}
	b := setup(t, store, &idemconnect.HandlerOptions{RetryAfter: time.Minute})
	c := b.client(t, createProc, connect.WithInterceptors(idemconnect.NewClientInterceptor(nil)))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second) // less than MaxRetryDelay (10 s)
	defer cancel()
	start := time.Now()
	_, err := c.CallUnary(ctx, connect.NewRequest(wrapperspb.String("mia")))
	wantCode(t, "store down", err, connect.CodeUnavailable, idem.CodeStoreUnavailable)
	if d, ok := idemconnect.RetryDelay(err); !ok || d != time.Minute {
		t.Errorf("RetryInfo %v %v", d, ok)
	}
	if store.claims.Load() != 1 || time.Since(start) > 4*time.Second {
		t.Errorf("%d attempts in %v", store.claims.Load(), time.Since(start))
	}
}

// Side-effect-free procedures get no key from the client by default.
func TestClientLeavesSideEffectFreeCallsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, newStore(t), nil)
	c := b.client(t, getProc, connect.WithIdempotency(connect.IdempotencyNoSideEffects),
		connect.WithInterceptors(idemconnect.NewClientInterceptor(nil)))
	if _, err := call(t, c, "", "noah"); err != nil {
		t.Fatal(err)
	}
	if v, _ := b.orders.keys.Load(int64(1)); len(v.([]string)) != 0 {
		t.Errorf("a NO_SIDE_EFFECTS call got key %q", v)
	}
}
