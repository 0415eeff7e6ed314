package backend

import (
	"context"
	"crypto/rand"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemhq/idem/internal/testcluster"
	"github.com/jackc/pgx/v5"
)

// readyBound is how long a Ready call may take against a frozen server in
// these tests: its one-second deadline and room for a loaded machine.
const readyBound = 3 * time.Second

// freezer forwards TCP connections to a target and can freeze: the
// connections stay open and nothing gets through, as with a server that
// hangs.
type freezer struct {
	ln     net.Listener
	mu     sync.Mutex
	thaw   chan struct{} // non-nil while frozen
	conns  []net.Conn
	wg     sync.WaitGroup
	target string
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, target: target}
	f.wg.Go(f.accept)
	t.Cleanup(func() {
		ln.Close()
		f.unfreeze()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *freezer) addr() string { return f.ln.Addr().String() }

func (f *freezer) accept() {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.DialTimeout("tcp", f.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		f.mu.Lock()
		f.conns = append(f.conns, c, up)
		f.mu.Unlock()
		f.wg.Go(func() { f.pipe(up, c) })
		f.wg.Go(func() { f.pipe(c, up) })
	}
}

func (f *freezer) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f.mu.Lock()
			thaw := f.thaw
			f.mu.Unlock()
			if thaw != nil {
				<-thaw
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thaw == nil {
		f.thaw = make(chan struct{})
	}
}

func (f *freezer) unfreeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.thaw != nil {
		close(f.thaw)
		f.thaw = nil
	}
}

// reachable skips the test when nothing listens at hostport and CI is
// unset (with CI set it fails).
func reachable(t *testing.T, what, hostport string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", hostport, 3*time.Second)
	if err == nil {
		c.Close()
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s at %s is unreachable (CI is set): %v", what, hostport, err)
	}
	t.Skipf("%s at %s is unreachable: %v", what, hostport, err)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// checkReadyCycle checks s.Ready: nil while the server answers, an error
// within readyBound once fwd is frozen, nil again after the thaw.
func checkReadyCycle(t *testing.T, s *Store, fwd *freezer) {
	t.Helper()
	ready := func() (time.Duration, error) {
		began := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := s.Ready(ctx)
		return time.Since(began), err
	}
	if _, err := ready(); err != nil {
		t.Fatalf("Ready with the server answering: %v", err)
	}
	fwd.freeze()
	took, err := ready()
	if err == nil || took > readyBound {
		t.Fatalf("Ready with the server frozen: %v after %v", err, took)
	}
	t.Logf("%s frozen: %v after %v", s.Kind, err, took.Round(time.Millisecond))
	fwd.unfreeze()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := ready()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Ready after the thaw: %v", err)
		}
	}
}

// Ready answers for each kind of backend, and a frozen PostgreSQL or Redis
// fails it within its deadline.
func TestReady(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		s, err := Open(context.Background(), filepath.Join(t.TempDir(), "r.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Ready(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		s, err := Open(context.Background(), "memory")
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Ready(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		admin := envOr("IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
		u, err := url.Parse(admin)
		if err != nil {
			t.Fatal(err)
		}
		reachable(t, "PostgreSQL", u.Host)
		schema := "ready_" + strings.ToLower(rand.Text()[:8])
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			conn, err := pgx.Connect(ctx, admin)
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
				t.Error(err)
			}
		})
		fwd := newFreezer(t, u.Host)
		u.Host = fwd.addr()
		q := u.Query()
		q.Set("idem_schema", schema)
		u.RawQuery = q.Encode()
		s, err := Open(context.Background(), u.String())
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		checkReadyCycle(t, s, fwd)
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		u, err := url.Parse(envOr("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
		if err != nil {
			t.Fatal(err)
		}
		reachable(t, "Redis", u.Host)
		fwd := newFreezer(t, u.Host)
		u.Host = fwd.addr()
		s, err := Open(context.Background(), u.String()+"?prefix=ready-test:")
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		checkReadyCycle(t, s, fwd)
	})
}

// On a Redis Cluster, Ready pings every master: with one master down
// (before any failover) it fails and names that node.
func TestReadyRedisCluster(t *testing.T) {
	cl := testcluster.Start(t)
	s, err := Open(t.Context(), "redis+cluster://"+strings.Join(cl.Addrs()[:2], ","))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	err = s.Ready(ctx)
	cancel()
	if err != nil {
		t.Fatalf("Ready on a healthy cluster: %v", err)
	}
	var master string
	for _, addr := range cl.Addrs() {
		if out, err := testcluster.Do(t.Context(), addr, "INFO", "replication"); err == nil && strings.Contains(out, "role:master") {
			master = addr
			break
		}
	}
	if master == "" {
		t.Fatal("no master found")
	}
	cl.Kill(master)
	ctx, cancel = context.WithTimeout(t.Context(), time.Second)
	err = s.Ready(ctx)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "master "+master) {
		t.Fatalf("Ready with master %s killed: %v", master, err)
	}
}
