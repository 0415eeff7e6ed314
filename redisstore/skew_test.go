package redisstore_test

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/redisstore"
)

// Two instances whose clocks are hours apart share one Redis: leases and
// expiry follow the Redis clock, so neither steals the other's lease nor
// sees a record expire early or live too long.
func TestSkewedExecutorsShareLeases(t *testing.T) {
	t.Parallel()
	const (
		lease = 300 * time.Millisecond
		ttl   = 3 * time.Second
		skew  = 5 * time.Hour
	)
	ca, cb := newClient(t), newClient(t)
	prefix := newPrefix(t, ca)
	sa := newStore(t, ca, &redisstore.Config{Prefix: prefix})
	sb := newStore(t, cb, &redisstore.Config{Prefix: prefix})
	behind := newExecutor(t, sa, lease, ttl, func() time.Time { return time.Now().Add(-skew) })
	ahead := newExecutor(t, sb, lease, ttl, func() time.Time { return time.Now().Add(skew) })
	ctx := t.Context()

	t.Run("NoLeaseTheft", func(t *testing.T) {
		t.Parallel()
		p := idem.DoParams{Scope: idem.Scope("t", "POST /pay"), Key: "k-theft", Fingerprint: fpA}
		started, finish := make(chan *idem.RequestInfo, 1), make(chan struct{})
		type outcome struct {
			res *idem.Result
			err error
		}
		done := make(chan outcome, 1)
		go func() {
			res, err := behind.Do(ctx, p, func(ctx context.Context) (*idemstore.Response, error) {
				info, _ := idem.InfoFromContext(ctx)
				started <- info
				<-finish
				return &idemstore.Response{StatusCode: 201, Body: []byte("paid")}, nil
			})
			done <- outcome{res, err}
		}()
		var info *idem.RequestInfo
		select {
		case info = <-started:
		case o := <-done:
			t.Fatalf("the owner ended before its operation ran: %+v, %v", o.res, o.err)
		}
		claimedAt := time.Now()
		nearNow(t, "ExpiresAt of the claim", info.ExpiresAt, claimedAt.Add(ttl))

		// Three leases of real time: only the owner's renewals keep the
		// lease alive, and the instance hours ahead must still see it.
		wait(3 * lease)
		var ran atomic.Int32
		count := func(context.Context) (*idemstore.Response, error) {
			ran.Add(1)
			return &idemstore.Response{StatusCode: 201, Body: []byte("duplicate")}, nil
		}
		res, err := ahead.Do(ctx, p, count)
		if !errors.Is(err, idemstore.ErrInFlight) {
			t.Fatalf("instance %v ahead: Do = %v, want ErrInFlight", skew, err)
		}
		if !res.ExpiresAt.Equal(info.ExpiresAt) {
			t.Errorf("in-flight ExpiresAt %v, want the claim's %v", res.ExpiresAt, info.ExpiresAt)
		}

		close(finish)
		o := <-done
		if o.err != nil || o.res.Replayed || string(o.res.Response.Body) != "paid" {
			t.Fatalf("owner: %+v, %v", o.res, o.err)
		}
		res, err = ahead.Do(ctx, p, count)
		if err != nil || !res.Replayed || string(res.Response.Body) != "paid" {
			t.Fatalf("replay on the instance ahead: %+v, %v", res, err)
		}
		if !res.ExpiresAt.Equal(info.ExpiresAt) {
			t.Errorf("completion moved ExpiresAt from %v to %v", info.ExpiresAt, res.ExpiresAt)
		}
		res, err = behind.Do(ctx, p, count)
		if err != nil || !res.Replayed {
			t.Fatalf("replay on the instance behind: %+v, %v", res, err)
		}

		// The record expires when the Redis clock says, for both.
		waitUntil(info.ExpiresAt.Add(100 * time.Millisecond))
		res, err = ahead.Do(ctx, p, count)
		if err != nil || res.Replayed {
			t.Fatalf("after ExpiresAt: %+v, %v; want a new execution", res, err)
		}
		if n := ran.Load(); n != 1 {
			t.Fatalf("duplicate operation ran %d times, want once (after expiry)", n)
		}
	})

	t.Run("CrashedOwnerTakenOverAfterLease", func(t *testing.T) {
		t.Parallel()
		p := idem.DoParams{Scope: idem.Scope("t", "POST /pay"), Key: "k-crash", Fingerprint: fpA}
		// An owner that claimed and died: its lease is never renewed.
		if r, err := sa.Claim(ctx, idemstore.ClaimParams{Scope: p.Scope, Key: p.Key, Fingerprint: fpA, Token: "crashed",
			Lease: lease, TTL: ttl, Now: time.Now()}); err != nil || r.Outcome != idemstore.ClaimAcquired {
			t.Fatalf("Claim: %v, %v", r.Outcome, err)
		}
		claimedAt := time.Now()
		op := func(context.Context) (*idemstore.Response, error) {
			return &idemstore.Response{StatusCode: 200, Body: []byte("retried")}, nil
		}
		// Hours ahead, the lease is still live...
		if _, err := ahead.Do(ctx, p, op); !errors.Is(err, idemstore.ErrInFlight) {
			t.Fatalf("instance ahead during the lease: %v, want ErrInFlight", err)
		}
		// ...and hours behind, it is not live forever.
		waitUntil(claimedAt.Add(lease + 100*time.Millisecond))
		res, err := behind.Do(ctx, p, op)
		if err != nil || !res.TookOver || string(res.Response.Body) != "retried" {
			t.Fatalf("instance behind after the lease: %+v, %v; want a take-over", res, err)
		}
		nearNow(t, "ExpiresAt after take-over", res.ExpiresAt, time.Now().Add(ttl))
	})
}

func newExecutor(t *testing.T, s idemstore.Store, lease, ttl time.Duration, now func() time.Time) *idem.Executor {
	t.Helper()
	e, err := idem.NewExecutor(s, &idem.Config{Lease: lease, TTL: ttl, NowFunc: now,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatalf("NewExecutor: %v", err)
	}
	return e
}

// nearNow checks a time computed by Redis against the local clock: both run
// on this machine, so they agree to well within a second.
func nearNow(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if d := got.Sub(want); d < -time.Second || d > time.Second {
		t.Errorf("%s = %v, want about %v (off by %v)", what, got, want, d)
	}
}

// wait lets d of real time pass: leases and TTLs are decided by the Redis
// server's clock, so there is nothing to synchronise on but time itself.
func wait(d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
}

func waitUntil(at time.Time) { wait(time.Until(at)) }

const (
	fpA = idem.FingerprintVersion + ":aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	fpB = idem.FingerprintVersion + ":bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)
