package redisstore_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// On a Redis of the test's own (no other client resizes its table), a walk
// one record at a time lists every record exactly once, including the
// records of a hash bucket that holds more than one page: the cursor then
// remembers which of them were listed.
func TestListSplitsBuckets(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.addr()})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// 300 keys in a table of 512 buckets: dozens of buckets hold two.
	want := map[string]bool{}
	for i := range 300 {
		p := idemstore.ClaimParams{Scope: "t", Key: fmt.Sprint(i), Fingerprint: fpA, Token: "owner", Lease: time.Minute, TTL: time.Hour}
		if _, err := s.Claim(ctx, p); err != nil {
			t.Fatal(err)
		}
		want[s.Key(p.Scope, p.Key)] = true
	}
	seen := map[string]int{}
	splits := 0
	p := idemstore.ListParams{Limit: 1}
	for pages := 0; ; pages++ {
		page, err := s.List(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			seen[r.ID]++
		}
		if page.Next == "" {
			break
		}
		n, err := redisstore.CursorSkips(page.Next)
		if err != nil {
			t.Fatalf("the store's own cursor: %v", err)
		}
		if n > 0 {
			splits++
		}
		if pages > 10*len(want) {
			t.Fatal("the walk does not end")
		}
		p.After = page.Next
	}
	for id := range want {
		if seen[id] != 1 {
			t.Errorf("%s listed %d times", id, seen[id])
		}
	}
	if len(seen) != len(want) {
		t.Errorf("listed %d records, want %d", len(seen), len(want))
	}
	if splits == 0 {
		t.Error("no page ended inside a bucket: the test did not reach the case it is for")
	}
}

// A SCAN cursor means nothing to another run of the server: a cursor made
// before a restart is refused, not followed into the wrong records.
func TestListCursorAfterRestart(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.addr()})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for i := range 20 {
		if _, err := s.Claim(ctx, idemstore.ClaimParams{Scope: "t", Key: fmt.Sprint(i), Fingerprint: fpA, Token: "o", Lease: time.Minute, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	page, err := s.List(ctx, idemstore.ListParams{Limit: 5})
	if err != nil || page.Next == "" {
		t.Fatalf("List: %d records, next %q, %v", len(page.Records), page.Next, err)
	}
	if _, err := s.List(ctx, idemstore.ListParams{Limit: 5, After: page.Next}); err != nil {
		t.Fatalf("List after the first page: %v", err)
	}
	srv.stop()
	srv.start()
	_, err = s.List(ctx, idemstore.ListParams{Limit: 5, After: page.Next})
	if !errors.Is(err, idemstore.ErrInvalidCursor) || !strings.Contains(err.Error(), "restarted") {
		t.Errorf("List with a cursor from before a restart: %v, want ErrInvalidCursor saying why", err)
	}
}

// A server that refuses INFO (renamed away, as some managed services do)
// is still listed, page by page; only a restart goes unnoticed there.
func TestListWithoutInfo(t *testing.T) {
	t.Parallel()
	srv := startRedis(t, "--rename-command", "INFO", "")
	c := redis.NewClient(&redis.Options{Addr: srv.addr()})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := c.Info(ctx, "server").Err(); err == nil {
		t.Fatal("INFO still answers")
	}
	for i := range 30 {
		if _, err := s.Claim(ctx, idemstore.ClaimParams{Scope: "t", Key: fmt.Sprint(i), Fingerprint: fpA, Token: "o", Lease: time.Minute, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	p := idemstore.ListParams{Limit: 4}
	for {
		page, err := s.List(ctx, p)
		if err != nil {
			t.Fatalf("List without INFO: %v", err)
		}
		for _, r := range page.Records {
			seen[r.ID] = true
		}
		if p.After = page.Next; p.After == "" {
			break
		}
	}
	if len(seen) != 30 {
		t.Errorf("listed %d records, want 30", len(seen))
	}
}

// FuzzParseCursor: any input is refused with ErrInvalidCursor or is a
// cursor in its one canonical form, printable ASCII without spaces.
func FuzzParseCursor(f *testing.F) {
	f.Add("")
	f.Add("r1.")
	f.Add("r1.AChkZDk3OTgxNzk2ZTdhYzE2ZmY4MGVjMGVlZDdhMjlhZGEyYTQzZmVkwQEA")
	f.Add("k1.AAAA")
	f.Fuzz(func(t *testing.T, s string) {
		if s == "" {
			return // the start of a walk, not a cursor
		}
		c, err := redisstore.CanonicalCursor(s)
		if err != nil {
			if !errors.Is(err, idemstore.ErrInvalidCursor) {
				t.Fatalf("%q: %v does not wrap ErrInvalidCursor", s, err)
			}
			return
		}
		if c != s {
			t.Fatalf("%q was accepted but its canonical form is %q", s, c)
		}
		if strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r > '~' }) {
			t.Fatalf("the cursor %q is not printable ASCII without spaces", s)
		}
	})
}
