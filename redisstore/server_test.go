package redisstore_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// privateRedis is a redis-server process of the test's own, for what must
// not be done to the shared server: flushing its script cache, restarting
// it.
type privateRedis struct {
	t     *testing.T
	port  int
	dir   string
	extra []string // more redis-server arguments
	cmd   *exec.Cmd
}

// startRedis starts redis-server without persistence on a free loopback
// port and stops it when t ends.
func startRedis(t *testing.T, extra ...string) *privateRedis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("redis-server not installed")
		}
		t.Fatal("redis-server not installed")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &privateRedis{t: t, port: ln.Addr().(*net.TCPAddr).Port, dir: t.TempDir(), extra: extra}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *privateRedis) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

func (r *privateRedis) start() {
	r.t.Helper()
	r.cmd = exec.Command("redis-server", append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--loglevel", "warning"}, r.extra...)...)
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("starting redis-server: %v", err)
	}
	// Ready when it answers PING; the process needs real time to start.
	c := redis.NewClient(&redis.Options{Addr: r.addr(), MaxRetries: -1, DialerRetries: 1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			r.t.Fatal("redis-server did not answer PING within 10s")
		}
		<-tick.C
	}
}

func (r *privateRedis) stop() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait() // the error is the kill's signal
	r.cmd = nil
}

// The scripts are sent by SHA; when Redis no longer has them (SCRIPT FLUSH,
// a restart, a failover to a replica that never saw them) the store falls
// back to sending the source, which loads them again.
func TestScriptsReloadAfterFlush(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.addr()})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	p := idemstore.ClaimParams{Scope: idem.Scope("t", "POST /x"), Key: "k", Fingerprint: fpA, Token: "owner",
		Lease: time.Minute, TTL: time.Hour}
	mustAcquire(t, s, p)
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Renew(ctx, idemstore.RenewParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Lease: time.Minute}); err != nil {
		t.Fatalf("Renew after SCRIPT FLUSH: %v", err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: &idemstore.Response{StatusCode: 204}}); err != nil {
		t.Fatalf("Complete after SCRIPT FLUSH: %v", err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.Token = "retry"
	if r, err := s.Claim(ctx, p); err != nil || r.Outcome != idemstore.ClaimCompleted {
		t.Fatalf("Claim after SCRIPT FLUSH: %v %v", r.Outcome, err)
	}
}

// The durability caveat, shown: a Redis that restarts without the data (no
// persistence here; with replication, a failover to a replica that missed
// the last writes) has forgotten a completed record, so a retry runs the
// operation again. The same client and store work across the restart.
func TestRestartLosesUnpersistedRecords(t *testing.T) {
	t.Parallel()
	srv := startRedis(t)
	c := redis.NewClient(&redis.Options{Addr: srv.addr()})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	p := idemstore.ClaimParams{Scope: idem.Scope("t", "POST /x"), Key: "k", Fingerprint: fpA, Token: "first",
		Lease: time.Minute, TTL: time.Hour}
	mustAcquire(t, s, p)
	if err := s.Complete(ctx, idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: p.Token, Response: &idemstore.Response{StatusCode: 201}}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	srv.stop()
	srv.start()
	p.Token = "after-restart"
	r, err := s.Claim(ctx, p)
	if err != nil {
		t.Fatalf("Claim after the restart: %v", err)
	}
	if r.Outcome != idemstore.ClaimAcquired {
		t.Fatalf("Claim after a restart without persistence = %v, want acquired (the record is lost)", r.Outcome)
	}
}
