package redisstore_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = c.Close() })
	for name, cfg := range map[string]*redisstore.Config{
		"OpenBrace":        {Prefix: "idem:{x:"},
		"CloseBrace":       {Prefix: "idem}:"},
		"NegativeBody":     {MaxResponseBytes: -1},
		"NegativeHeaders":  {MaxHeaderBytes: -1},
		"BraceInTheMiddle": {Prefix: "a{b}c:"},
	} {
		if _, err := redisstore.New(c, cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
	if _, err := redisstore.New(nil, nil); err == nil {
		t.Error("New accepted a nil client")
	}
	if _, err := redisstore.New(c, nil); err != nil {
		t.Errorf("New with defaults: %v", err)
	}
}

var keyForm = regexp.MustCompile(`^p:\{[0-9a-f]{64}\}$`)

// Every record key carries exactly one hash tag, the digest, whatever the
// scope and key contain, so Redis Cluster places it by the digest; and no
// key or scope appears in clear.
func TestKeyLayout(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, &redisstore.Config{Prefix: "p:"})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for _, sk := range [][2]string{
		{"", ""}, {"a", "bc"}, {"ab", "c"}, {idem.Scope("{t}", "POST /x"), "{k}"},
		{idem.Scope("t", "POST /x"), "}{"}, {idem.Scope("t", "POST /x"), "secret-order-42"},
		{"a\x00b", "c"}, {"a", "\x00bc"},
	} {
		k := s.Key(sk[0], sk[1])
		if !keyForm.MatchString(k) {
			t.Errorf("Key(%q, %q) = %q, want prefix + {64 hex digits}", sk[0], sk[1], k)
		}
		if len(sk[1]) > 8 && strings.Contains(k, sk[1]) {
			t.Errorf("Key(%q, %q) = %q contains the key in clear", sk[0], sk[1], k)
		}
		if prev, dup := seen[k]; dup {
			t.Errorf("Key(%q, %q) = Key of %s", sk[0], sk[1], prev)
		}
		seen[k] = sk[0] + "|" + sk[1]
	}
	if a, b := s.Key("t", "k"), s.Key("t", "k"); a != b {
		t.Error("Key is not deterministic")
	}
}

// The record's Redis expiry is its ExpiresAt, set by the claim and left
// alone by renewal and completion: Redis does all the cleaning.
func TestRedisExpiryIsRetention(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	p := idemstore.ClaimParams{Scope: idem.Scope("t", "POST /x"), Key: "k", Fingerprint: fpA, Token: "tok",
		Lease: 10 * time.Second, TTL: time.Hour, Now: time.Now()}
	r := mustAcquire(t, s, p)
	key := s.Key(p.Scope, p.Key)
	expiry := func(when string) {
		t.Helper()
		at, err := c.PExpireTime(ctx, key).Result()
		if err != nil {
			t.Fatalf("PEXPIRETIME %s: %v", when, err)
		}
		if at != time.Duration(r.Record.ExpiresAt.UnixMilli())*time.Millisecond {
			t.Errorf("%s: Redis expiry %v, want ExpiresAt %v", when, time.UnixMilli(at.Milliseconds()).UTC(), r.Record.ExpiresAt)
		}
	}
	expiry("after the claim")
	if err := s.Renew(ctx, idemstore.RenewParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Lease: time.Minute}); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	expiry("after a renewal")
	if err := s.Complete(ctx, idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: &idemstore.Response{StatusCode: 200}}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	expiry("after completion")
	// A completed record keeps no owner token or lease, and a new key's
	// record no fence (n): nothing ever takes a completed record over, and
	// a take-over of an in-flight one draws a greater fence from the clock
	// (TestLeaseEndNeverMovesEarlier).
	fields, err := c.HKeys(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Field order is the server's (it changes with the hash's encoding).
	slices.Sort(fields)
	if strings.Join(fields, ",") != "e,f,r" {
		t.Errorf("completed record has fields %v, want e, f, r", fields)
	}
}

// A new key's record does not store its fence: the next claim's fence is
// greater because a take-over needs the Redis clock past the lease end,
// which is later than the fence's millisecond. That holds only if a
// renewal never moves the lease end earlier, which it would if the Redis
// clock went back (simulated here by a renewal with a shorter lease): the
// record keeps the later lease end.
func TestLeaseEndNeverMovesEarlier(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	p := idemstore.ClaimParams{Scope: idem.Scope("t", "POST /x"), Key: "k", Fingerprint: fpA, Token: "tok",
		Lease: time.Hour, TTL: 2 * time.Hour}
	r := mustAcquire(t, s, p)
	key := s.Key(p.Scope, p.Key)
	if n, err := c.HExists(ctx, key, "n").Result(); err != nil || n {
		t.Errorf("a new key's record stores its fence (n): %v %v", n, err)
	}
	if err := s.Renew(ctx, idemstore.RenewParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Lease: time.Millisecond}); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	l, err := c.HGet(ctx, key, "l").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if want := r.Record.LeaseExpiresAt.UnixMilli(); l != want {
		t.Errorf("lease end after a renewal to an earlier end: %v, want it kept at %v", time.UnixMilli(l).UTC(), r.Record.LeaseExpiresAt)
	}
	q := p
	q.Token = "other"
	if r, err := s.Claim(ctx, q); err != nil || r.Outcome != idemstore.ClaimInFlight {
		t.Errorf("claim by another after the renewal: %v %v, want in flight", r.Outcome, err)
	}
}

// DeleteExpired validates its limit and deletes nothing, because Redis has
// already deleted every record whose retention ended; unexpired records
// are untouched. This is what storetest's DeleteExpiredInBatches is about
// (see knownSuiteGap).
func TestDeleteExpired(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	const ttl = 500 * time.Millisecond
	claim := func(key string, ttl time.Duration) idemstore.ClaimParams {
		t.Helper()
		p := idemstore.ClaimParams{Scope: idem.Scope("t", "POST /x"), Key: key, Fingerprint: fpA, Token: "tok-" + key,
			Lease: ttl, TTL: ttl, Now: time.Now()}
		mustAcquire(t, s, p)
		return p
	}
	old := claim("old", ttl)
	fresh := claim("fresh", time.Hour)
	start := time.Now()
	for _, limit := range []int{0, -1} {
		if _, err := s.DeleteExpired(ctx, idemstore.DeleteExpiredParams{Limit: limit, Now: time.Now()}); err == nil {
			t.Errorf("DeleteExpired with limit %d succeeded", limit)
		}
	}
	waitUntil(start.Add(ttl + 100*time.Millisecond))
	n, err := s.DeleteExpired(ctx, idemstore.DeleteExpiredParams{Limit: 100, Now: time.Now()})
	if err != nil || n != 0 {
		t.Fatalf("DeleteExpired = %d, %v; want 0, nil", n, err)
	}
	if exists, err := c.Exists(ctx, s.Key(old.Scope, old.Key)).Result(); err != nil || exists != 0 {
		t.Errorf("expired record still in Redis: %d, %v", exists, err)
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Scope: old.Scope, Key: old.Key, Token: old.Token,
		Response: &idemstore.Response{StatusCode: 200}}); !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Errorf("Complete of an expired record: %v, want ErrLeaseLost", err)
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Scope: fresh.Scope, Key: fresh.Key, Token: fresh.Token,
		Response: &idemstore.Response{StatusCode: 200}}); err != nil {
		t.Errorf("Complete of an unexpired record: %v", err)
	}
}

// A value of another type at a record's key is a store failure, never a
// fencing answer or an outcome.
func TestForeignValueIsAnError(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, nil)
	ctx := t.Context()
	scope, key := idem.Scope("t", "POST /x"), "k"
	if err := c.Set(ctx, s.Key(scope, key), "not a hash", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Claim(ctx, idemstore.ClaimParams{Scope: scope, Key: key, Fingerprint: fpA, Token: "t",
		Lease: time.Second, TTL: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || !strings.HasPrefix(err.Error(), "redisstore: claim: ") {
		t.Errorf("Claim over a string value: %v, want a wrapped WRONGTYPE error", err)
	}
	err = s.Release(ctx, idemstore.ReleaseParams{Scope: scope, Key: key, Token: "t"})
	if err == nil || errors.Is(err, idemstore.ErrLeaseLost) {
		t.Errorf("Release over a string value: %v, want a store failure", err)
	}
}

func TestResponseTooLarge(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, &redisstore.Config{MaxResponseBytes: 1024, MaxHeaderBytes: 256})
	ctx := t.Context()
	p := idemstore.ClaimParams{Scope: idem.Scope("t", "POST /x"), Key: "k", Fingerprint: fpA, Token: "owner",
		Lease: time.Minute, TTL: time.Hour}
	mustAcquire(t, s, p)
	complete := func(resp *idemstore.Response) error {
		return s.Complete(ctx, idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: resp})
	}
	tooBig := map[string]*idemstore.Response{
		"Body":    {StatusCode: 200, Body: bytes.Repeat([]byte("x"), 1025)},
		"Headers": {StatusCode: 200, Header: http.Header{"X-Big": {strings.Repeat("h", 300)}}},
	}
	for name, resp := range tooBig {
		if err := complete(resp); !errors.Is(err, idemstore.ErrResponseTooLarge) {
			t.Errorf("%s over the limit: Complete = %v, want ErrResponseTooLarge", name, err)
		}
	}
	// Nothing changed: the record is still in flight and owned.
	q := p
	q.Token = "retry"
	if r, err := s.Claim(ctx, q); err != nil || r.Outcome != idemstore.ClaimInFlight {
		t.Fatalf("Claim after refused completions: %v %v, want in flight", r.Outcome, err)
	}
	want := &idemstore.Response{StatusCode: 200, Header: http.Header{"X-Ok": {"1"}}, Body: bytes.Repeat([]byte("y"), 1024)}
	if err := complete(want); err != nil {
		t.Fatalf("Complete at the limit: %v", err)
	}
	r, err := s.Claim(ctx, q)
	if err != nil || r.Outcome != idemstore.ClaimCompleted || !bytes.Equal(r.Record.Response.Body, want.Body) {
		t.Fatalf("replay: %v %v", r.Outcome, err)
	}
}

// Through the middleware, a response the store cannot hold still reaches
// the first client in full; a retry learns that it ran (409
// response_unavailable) and the handler never runs twice.
func TestResponseTooLargeThroughMiddleware(t *testing.T) {
	t.Parallel()
	c := newClient(t)
	s := newStore(t, c, &redisstore.Config{MaxResponseBytes: 1024})
	srv, ran := newServer(t, s, nil)
	body := `{"blob":"` + strings.Repeat("z", 4096) + `"}`
	first := post(t, srv, "big", body)
	got, err := io.ReadAll(first.Body)
	if err != nil {
		t.Fatal(err)
	}
	if first.StatusCode != http.StatusCreated || string(got) != body {
		t.Fatalf("first response: status %d, %d bytes; want 201 and the %d bytes sent", first.StatusCode, len(got), len(body))
	}
	p := requireProblem(t, post(t, srv, "big", body), http.StatusConflict, idem.CodeResponseUnavailable)
	if p["originalStatus"] != float64(http.StatusCreated) {
		t.Errorf("originalStatus = %v, want 201", p["originalStatus"])
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("handler ran %d times, want once", n)
	}
}

// Two clients (two instances of a service) race 64 claims on one key:
// exactly one owns it, and only its token can act on the record.
func TestCrossClientRace(t *testing.T) {
	t.Parallel()
	ca, cb := newClient(t), newClient(t)
	prefix := newPrefix(t, ca)
	stores := []*redisstore.Store{
		newStore(t, ca, &redisstore.Config{Prefix: prefix}),
		newStore(t, cb, &redisstore.Config{Prefix: prefix}),
	}
	const n = 64
	scope, key := idem.Scope("t", "POST /x"), "contended"
	results := make([]idemstore.ClaimResult, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i], errs[i] = stores[i%2].Claim(t.Context(), idemstore.ClaimParams{Scope: scope, Key: key,
				Fingerprint: fpA, Token: tokenOf(i), Lease: time.Minute, TTL: time.Hour})
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, r := range results {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		switch r.Outcome {
		case idemstore.ClaimAcquired:
			if winner >= 0 {
				t.Fatalf("claims %d and %d both acquired the key", winner, i)
			}
			winner = i
		case idemstore.ClaimInFlight:
		default:
			t.Fatalf("claim %d: %v", i, r.Outcome)
		}
	}
	if winner < 0 {
		t.Fatal("no claim acquired the key")
	}
	for i := range n {
		// Through the other instance's client.
		err := stores[(i+1)%2].Renew(t.Context(), idemstore.RenewParams{Scope: scope, Key: key, Token: tokenOf(i), Lease: time.Minute})
		if (err == nil) != (i == winner) {
			t.Errorf("token %d (winner %d): Renew = %v", i, winner, err)
		}
	}
}

func tokenOf(i int) string { return "token-" + string(rune('A'+i/26)) + string(rune('a'+i%26)) }
