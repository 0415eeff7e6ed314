package drills_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5"
)

// pgBin is where PostgreSQL's server programs are (Debian's layout);
// IDEM_TEST_PG_BIN overrides it.
func pgBin() string { return envOr("IDEM_TEST_PG_BIN", "/usr/lib/postgresql/15/bin") }

// pgCluster is a primary and a streaming replica of the test's own, on free
// loopback ports, in a directory owned by the postgres user (the server
// programs refuse to run as root).
type pgCluster struct {
	t                *testing.T
	dir              string
	primary, replica string // data directories
	pPort, rPort     int
}

// runPG runs one of PostgreSQL's programs, as the postgres user when the
// test runs as root.
func (c *pgCluster) run(prog string, args ...string) {
	c.t.Helper()
	path := filepath.Join(pgBin(), prog)
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	cmd.Dir = c.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		logs, _ := os.ReadFile(filepath.Join(c.dir, "replica.log"))
		if len(logs) > 3000 {
			logs = logs[len(logs)-3000:]
		}
		c.t.Fatalf("%s %v: %v\n%s\nreplica.log (end):\n%s", prog, args, err, out, logs)
	}
}

// startPGCluster starts a primary and a replica streaming from it. With
// sync the primary waits for the replica to flush every commit
// (synchronous_standby_names); the replica, once promoted, waits for
// nobody. Both are stopped when t ends.
func startPGCluster(t *testing.T, sync bool) *pgCluster {
	t.Helper()
	if _, err := os.Stat(filepath.Join(pgBin(), "initdb")); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("PostgreSQL server programs not in %s (set IDEM_TEST_PG_BIN; set CI to make this fail)", pgBin())
		}
		t.Fatalf("PostgreSQL server programs not in %s: %v", pgBin(), err)
	}
	dir, err := os.MkdirTemp("", "idem-pgdrill-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs the postgres user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	c := &pgCluster{t: t, dir: dir, primary: filepath.Join(dir, "primary"), replica: filepath.Join(dir, "replica"),
		pPort: freePort(t), rPort: freePort(t)}
	c.run("initdb", "-D", c.primary, "-U", "postgres", "--auth=trust", "--no-sync")
	standbys := ""
	if sync {
		standbys = "replica"
	}
	c.conf(c.primary, c.pPort, fmt.Sprintf("wal_level = replica\nmax_wal_senders = 4\nsynchronous_standby_names = '%s'\n", standbys))
	t.Cleanup(func() { c.stop(c.primary) })
	c.run("pg_ctl", "-D", c.primary, "-l", filepath.Join(dir, "primary.log"), "-w", "start")
	c.run("pg_basebackup", "-D", c.replica, "-X", "stream", "-R",
		"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=replica", c.pPort))
	// Once promoted, the replica has no standby of its own to wait for.
	// It retries a lost primary every 200 ms instead of every 5 s, which
	// would otherwise delay a promotion requested meanwhile by as much.
	c.conf(c.replica, c.rPort, "synchronous_standby_names = ''\nwal_retrieve_retry_interval = '200ms'\n")
	t.Cleanup(func() { c.stop(c.replica) })
	c.run("pg_ctl", "-D", c.replica, "-l", filepath.Join(dir, "replica.log"), "-w", "start")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.url(c.pPort))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return c
		}
		if wait(ctx, 50*time.Millisecond) {
			t.Fatal("the replica did not start streaming within 30 s")
		}
	}
}

// promote promotes the replica with pg_promote, once it accepts
// connections: after its WAL receiver was killed the replica restarts its
// processes, and a promotion signalled meanwhile (pg_ctl promote) would be
// lost.
func (c *pgCluster) promote() {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.t.Context(), 60*time.Second)
	defer cancel()
	for {
		conn, err := pgx.Connect(ctx, c.url(c.rPort))
		if err == nil {
			// An earlier attempt may have promoted it even though its
			// answer was lost (pg_promote then fails with "recovery is
			// not in progress"): the replica's state decides.
			var inRecovery, ok bool
			if err = conn.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err == nil && !inRecovery {
				conn.Close(context.Background())
				return
			}
			if err == nil {
				err = conn.QueryRow(ctx, `SELECT pg_promote(true, 60)`).Scan(&ok)
			}
			conn.Close(context.Background())
			if err == nil && ok {
				return
			}
		}
		if wait(ctx, 50*time.Millisecond) {
			c.t.Fatalf("promoting the replica: %v", err)
		}
	}
}

// conf appends settings to a data directory's postgresql.conf.
func (c *pgCluster) conf(data string, port int, extra string) {
	c.t.Helper()
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "\nport = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\n%s",
		port, c.dir, extra); err != nil {
		c.t.Fatal(err)
	}
}

// stop stops a server hard (no checkpoint, no goodbye to clients), as a
// machine that dies; stopping one already stopped does nothing.
func (c *pgCluster) stop(data string) {
	path := filepath.Join(pgBin(), "pg_ctl")
	args := []string{"-D", data, "-m", "immediate", "-w", "stop"}
	var cmd *exec.Cmd
	if os.Geteuid() == 0 {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", path}, args...)...)
	} else {
		cmd = exec.Command(path, args...)
	}
	_ = cmd.Run() // fails when already stopped
}

func (c *pgCluster) url(port int) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", port)
}

// serviceURL names both servers; pgx connects to the one that accepts
// writes, so new connections find the promoted replica by themselves.
func (c *pgCluster) serviceURL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=1&target_session_attrs=read-write",
		c.pPort, c.rPort)
}

func freePort(t *testing.T) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// The PostgreSQL failover drill: a service on a primary with a streaming
// replica, under steady traffic of new keys and duplicates; the primary is
// stopped hard (pg_ctl stop -m immediate), the replica promoted, and idem,
// whose connection string names both servers with
// target_session_attrs=read-write, reconnects to it. Then every key is sent
// once more. It reports how many keys executed twice and for how long
// requests were refused, with asynchronous and with synchronous
// replication. As in the Redis drill, the "lagging" variants make the
// replica fall behind first (its WAL receiver is stopped for lagWindow,
// then killed with the primary). docs/operations.md records the results of
// IDEM_DRILL_LONG=1, which also runs the variants without lag.
func TestPostgresFailoverDrill(t *testing.T) {
	t.Parallel()
	type mode struct {
		name      string
		sync, lag bool
	}
	modes := []mode{{"async-lagging", false, true}, {"sync-lagging", true, true}}
	if long() {
		modes = append([]mode{{"async", false, false}, {"sync", true, false}}, modes...)
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { pgFailover(t, m.name, m.sync, m.lag) })
	}
}

func pgFailover(t *testing.T, name string, sync, lag bool) {
	c := startPGCluster(t, sync)
	pool := newPool(t, c.serviceURL())
	store := newPGStore(t, pool, pgstore.Config{})
	d := newDrill(t, store)
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); d.traffic(ctx, name, 8) }()
	defer func() { stop(); <-done }()

	wait(t.Context(), scale(time.Second, 10*time.Second))
	fault := time.Now()
	var receiver int
	if lag {
		// The replica falls behind: its WAL receiver stops reading for
		// lagWindow, and what it had not written yet dies with it.
		conn, err := pgx.Connect(t.Context(), c.url(c.rPort))
		if err != nil {
			t.Fatal(err)
		}
		err = conn.QueryRow(t.Context(), `SELECT pid FROM pg_stat_wal_receiver`).Scan(&receiver)
		conn.Close(context.Background())
		if err != nil {
			t.Fatalf("the replica's WAL receiver: %v", err)
		}
		if err := syscall.Kill(receiver, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		wait(t.Context(), lagWindow)
	}
	c.stop(c.primary)
	if lag {
		_ = syscall.Kill(receiver, syscall.SIGKILL)
	}
	c.promote()
	promoted := time.Since(fault)
	wait(t.Context(), scale(2*time.Second, 10*time.Second))
	stop()
	<-done
	rctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	d.replayAll(rctx)
	if rctx.Err() != nil {
		t.Fatal("the duplicates sent after the drill were still refused after 60 s")
	}
	r := d.result(fault)
	t.Logf("%s: replica promoted %v after the fault; %v", name, promoted.Round(10*time.Millisecond), r)
	if r.Refused == 0 {
		t.Error("no request was refused: the stop did not reach the traffic")
	}
	switch {
	case sync && r.Duplicates > 0:
		t.Errorf("%d keys executed twice although every commit waited for the replica", r.Duplicates)
	case lag && !sync && r.Duplicates == 0:
		t.Error("no key executed twice although the replica missed the last commits")
	}
}
