package drills_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// mariadbBin is the directory of MariaDB's server programs (Debian's
// layout); IDEM_TEST_MARIADB_BIN overrides it.
func mariadbBin() string { return envOr("IDEM_TEST_MARIADB_BIN", "/usr/sbin") }

// myCluster is a MariaDB primary and a replica of the test's own, plain
// processes on free loopback ports, replicating through the binary log.
// The service reaches whichever is primary through a TCP proxy, as it
// would through a virtual IP or a ProxySQL that an operator (or
// orchestrator) repoints at failover.
type myCluster struct {
	t            *testing.T
	dir          string
	pPort, rPort int
	pCmd, rCmd   *exec.Cmd
}

// startMyCluster starts a primary and a replica. With semiSync the primary
// waits, at every commit, for the replica to acknowledge that its binary
// log events reached the replica's relay log (AFTER_SYNC, without falling
// back to asynchronous replication).
func startMyCluster(t *testing.T, semiSync bool) *myCluster {
	t.Helper()
	install := "mariadb-install-db"
	if _, err := exec.LookPath(install); err != nil {
		if os.Getenv("CI") == "" {
			t.Skipf("%s not found (set CI to make this fail)", install)
		}
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "idem-mydrill-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 {
		u, err := user.Lookup("mysql")
		if err != nil {
			t.Fatalf("running as root needs the mysql user: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	c := &myCluster{t: t, dir: dir, pPort: freePort(t), rPort: freePort(t)}
	// One installation (15 s here), copied for the replica: both start
	// from the same empty data directory.
	out, err := exec.Command(install, "--user=mysql", "--datadir="+filepath.Join(dir, "primary"),
		"--auth-root-authentication-method=normal", "--skip-test-db", "--no-defaults").CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", install, err, out)
	}
	if out, err := exec.Command("cp", "-a", filepath.Join(dir, "primary"), filepath.Join(dir, "replica")).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	c.pCmd = c.start("primary", c.pPort, 1)
	c.rCmd = c.start("replica", c.rPort, 2)
	p, r := c.db(c.pPort), c.db(c.rPort)
	defer p.Close()
	defer r.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if semiSync {
		c.exec(ctx, p, "SET GLOBAL rpl_semi_sync_master_enabled = ON",
			"SET GLOBAL rpl_semi_sync_master_wait_point = 'AFTER_SYNC'",
			// Never fall back to asynchronous replication while the
			// replica does not answer: commits wait (and the claims fail
			// with 503 at StoreTimeout) instead.
			"SET GLOBAL rpl_semi_sync_master_timeout = 3600000")
		c.exec(ctx, r, "SET GLOBAL rpl_semi_sync_slave_enabled = ON")
	}
	c.exec(ctx, r, fmt.Sprintf("CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = %d, MASTER_USER = 'root', MASTER_USE_GTID = slave_pos", c.pPort),
		"START SLAVE")
	for {
		var n int
		if semiSync {
			err = p.QueryRowContext(ctx, "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME = 'RPL_SEMI_SYNC_MASTER_CLIENTS'").Scan(&n)
		} else {
			err = p.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE COMMAND LIKE 'Binlog Dump%'").Scan(&n)
		}
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return c
		}
		if wait(ctx, 50*time.Millisecond) {
			t.Fatal("the replica did not connect within 30 s")
		}
	}
}

// start runs mariadbd on the data directory name, stopped hard when the
// test ends.
func (c *myCluster) start(name string, port, id int) *exec.Cmd {
	t := c.t
	data := filepath.Join(c.dir, name)
	cmd := exec.Command(filepath.Join(mariadbBin(), "mariadbd"), "--no-defaults", "--user=mysql", "--datadir="+data,
		"--port="+strconv.Itoa(port), "--bind-address=127.0.0.1", "--socket="+filepath.Join(c.dir, name+".sock"),
		"--pid-file="+filepath.Join(c.dir, name+".pid"), "--server-id="+strconv.Itoa(id),
		"--log-bin="+filepath.Join(data, "bin"), "--binlog-format=ROW", "--log-slave-updates",
		"--innodb-buffer-pool-size=64M", "--log-error="+filepath.Join(c.dir, name+".err"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		if conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			conn.Close()
			return cmd
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(c.dir, name+".err"))
			t.Fatalf("mariadbd %s did not listen within 60 s:\n%s", name, log)
		}
		wait(t.Context(), 100*time.Millisecond)
	}
}

func (c *myCluster) config(port int) *mysql.Config {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", fmt.Sprintf("127.0.0.1:%d", port), "mysql"
	cfg.Timeout = 2 * time.Second
	return cfg
}

func (c *myCluster) db(port int) *sql.DB {
	conn, err := mysql.NewConnector(c.config(port))
	if err != nil {
		c.t.Fatal(err)
	}
	return sql.OpenDB(conn)
}

func (c *myCluster) exec(ctx context.Context, db *sql.DB, stmts ...string) {
	c.t.Helper()
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			c.t.Fatalf("%s: %v", s, err)
		}
	}
}

// promote makes the replica a primary once it has applied every event it
// received: the I/O thread is stopped, the SQL thread drains the relay
// log, then replication is reset and writes are allowed.
func (c *myCluster) promote() {
	t := c.t
	r := c.db(c.rPort)
	defer r.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c.exec(ctx, r, "STOP SLAVE IO_THREAD")
	for {
		rows, err := r.QueryContext(ctx, "SHOW SLAVE STATUS")
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		state := ""
		if rows.Next() {
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			for i, col := range cols {
				if col == "Slave_SQL_Running_State" {
					state = string(vals[i])
				}
			}
		}
		rows.Close()
		if strings.Contains(state, "has read all relay log") {
			break
		}
		if wait(ctx, 20*time.Millisecond) {
			t.Fatalf("the replica did not apply its relay log within 60 s (%q)", state)
		}
	}
	c.exec(ctx, r, "STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL rpl_semi_sync_slave_enabled = OFF", "SET GLOBAL read_only = OFF")
}

// The MariaDB failover drill, as the PostgreSQL one: a service on a
// primary with a replica, under steady traffic of new keys and duplicates;
// the primary is killed (SIGKILL), the replica promoted once it applied
// what it received, and the proxy in front of the service repointed at
// it. Then every key is sent once more. Asynchronous and semi-synchronous
// replication; the "lagging" variants stop the replica's I/O thread for
// lagWindow before the primary dies, so what it did not fetch is lost.
// docs/operations.md records the results.
func TestMySQLFailoverDrill(t *testing.T) {
	t.Parallel()
	type mode struct {
		name          string
		semiSync, lag bool
	}
	modes := []mode{{"async-lagging", false, true}, {"semisync-lagging", true, true}}
	if long() {
		modes = append([]mode{{"async", false, false}, {"semisync", true, false}}, modes...)
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) { myFailover(t, m.name, m.semiSync, m.lag) })
	}
}

func myFailover(t *testing.T, name string, semiSync, lag bool) {
	c := startMyCluster(t, semiSync)
	admin := c.db(c.pPort)
	c.exec(t.Context(), admin, "CREATE DATABASE idem")
	admin.Close()
	px := newToxiproxy(t, fmt.Sprintf("127.0.0.1:%d", c.pPort))
	cfg := c.config(0)
	cfg.Addr, cfg.DBName, cfg.InterpolateParams = px.Listen, "idem", true
	cfg.ReadTimeout, cfg.WriteTimeout = 2*time.Second, 2*time.Second
	store := newMyStore(t, newMyDB(t, cfg), "records")
	d := newDrill(t, store)
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); d.traffic(ctx, name, 8) }()
	defer func() { stop(); <-done }()

	wait(t.Context(), scale(time.Second, 10*time.Second))
	fault := time.Now()
	if lag {
		r := c.db(c.rPort)
		c.exec(t.Context(), r, "STOP SLAVE IO_THREAD")
		r.Close()
		wait(t.Context(), lagWindow)
	}
	_ = c.pCmd.Process.Kill()
	_ = c.pCmd.Wait()
	c.promote()
	// The virtual IP moves: the proxy's connections end, new ones reach
	// the promoted replica.
	px.Stop()
	px.Upstream = fmt.Sprintf("127.0.0.1:%d", c.rPort)
	if err := px.Start(); err != nil {
		t.Fatalf("repoint the proxy: %v", err)
	}
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
		t.Error("no request was refused: the kill did not reach the traffic")
	}
	switch {
	case semiSync && r.Duplicates > 0:
		t.Errorf("%d keys executed twice although every commit waited for the replica", r.Duplicates)
	case lag && !semiSync && r.Duplicates == 0:
		t.Error("no key executed twice although the replica missed the last commits")
	}
}
