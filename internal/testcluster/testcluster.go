// Package testcluster starts a real Redis Cluster on loopback for tests:
// six redis-server processes (three masters, three replicas) on free ports,
// joined with `redis-cli --cluster create --cluster-replicas 1`, stopped when
// the test ends. It uses only the standard library (it speaks just enough
// RESP to ask a node PING and CLUSTER INFO), so that every module of the
// workspace can use it in its tests: redisstore's conformance suite,
// cmd/idem's multi-process tests and internal/drills' failover drill.
//
// Nothing here is part of idem's API; it is internal to the repository.
package testcluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// NodeTimeout is the cluster-node-timeout the nodes run with: how long a
// master may be unreachable before its replica is promoted. Redis's default
// is 15 s; 2 s keeps the failover drill short and still tolerates a loaded
// test machine.
const NodeTimeout = 2 * time.Second

// Cluster is a running Redis Cluster of six nodes.
type Cluster struct {
	tb    testing.TB
	mu    sync.Mutex
	nodes []*Node
}

// Node is one redis-server process of the cluster.
type Node struct {
	// Addr is the node's client address, 127.0.0.1:port.
	Addr string
	dir  string
	args []string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// Start starts a cluster of three masters with one replica each and stops
// it when tb ends. Without redis-server or redis-cli the test is skipped,
// unless CI is set: then it fails.
func Start(tb testing.TB) *Cluster {
	tb.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") == "" {
				tb.Skipf("%s not installed (set CI to make this fail)", bin)
			}
			tb.Fatalf("%s not installed", bin)
		}
	}
	c := &Cluster{tb: tb}
	tb.Cleanup(c.stop)
	root := tb.TempDir()
	for i := range 6 {
		ports := freePorts(tb, 2) // client port and cluster bus port
		n := &Node{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])),
			dir: filepath.Join(root, strconv.Itoa(i))}
		if err := os.Mkdir(n.dir, 0o700); err != nil {
			tb.Fatal(err)
		}
		n.args = []string{
			"--port", strconv.Itoa(ports[0]), "--cluster-port", strconv.Itoa(ports[1]),
			"--bind", "127.0.0.1", "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(n.dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.Itoa(int(NodeTimeout.Milliseconds())),
			// Replicas sync at once, not after the default 5 s that
			// lets a master batch several of them.
			"--repl-diskless-sync-delay", "0",
			"--save", "", "--appendonly", "no", "--dir", n.dir, "--loglevel", "warning"}
		if err := n.start(); err != nil {
			tb.Fatal(err)
		}
		c.mu.Lock()
		c.nodes = append(c.nodes, n)
		c.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, n := range c.nodes {
		if err := poll(ctx, func() error { _, err := Do(ctx, n.Addr, "PING"); return err }); err != nil {
			tb.Fatalf("redis-server %s did not answer PING: %v", n.Addr, err)
		}
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.WaitHealthy(ctx); err != nil {
		tb.Fatal(err)
	}
	return c
}

// Addrs returns the client addresses of every node, masters and replicas,
// including killed ones.
func (c *Cluster) Addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr
	}
	return addrs
}

// Kill kills the node at addr with SIGKILL, the way a machine dies, and
// waits for the process to exit.
func (c *Cluster) Kill(addr string) {
	c.tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.Addr == addr {
			_ = n.cmd.Process.Kill()
			<-n.done
			return
		}
	}
	c.tb.Fatalf("testcluster: no node %s", addr)
}

// Restart starts the killed node at addr again, with its cluster
// configuration but without data: it rejoins the cluster (a killed master
// as a replica of the replica that replaced it) and synchronises from its
// master, as a replaced machine would.
func (c *Cluster) Restart(addr string) {
	c.tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n.Addr == addr {
			<-n.done
			if err := n.start(); err != nil {
				c.tb.Fatal(err)
			}
			return
		}
	}
	c.tb.Fatalf("testcluster: no node %s", addr)
}

func (n *Node) start() error {
	n.cmd = exec.Command("redis-server", n.args...)
	n.cmd.Stdout, n.cmd.Stderr = io.Discard, io.Discard
	if err := n.cmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	done := make(chan struct{})
	n.done = done
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(done) }(n.cmd)
	return nil
}

// WaitHealthy waits until every live node reports cluster_state:ok, so that
// all 16384 slots are served, and every replica is in sync with its master.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	c.mu.Lock()
	nodes := append([]*Node(nil), c.nodes...)
	c.mu.Unlock()
	for _, n := range nodes {
		select {
		case <-n.done:
			continue
		default:
		}
		err := poll(ctx, func() error {
			info, err := Do(ctx, n.Addr, "CLUSTER", "INFO")
			if err != nil {
				return err
			}
			if !strings.Contains(info, "cluster_state:ok") {
				return errors.New("cluster_state is not ok")
			}
			// A replica serves its purpose (and WAIT counts it) once its
			// initial synchronisation is done.
			repl, err := Do(ctx, n.Addr, "INFO", "replication")
			if err != nil {
				return err
			}
			if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
				return errors.New("replica not in sync with its master")
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("testcluster: node %s: %w", n.Addr, err)
		}
	}
	return nil
}

// WaitFailover waits until the live nodes agree that the node at addr
// failed (a master: its replica was promoted) and the cluster serves every
// slot again.
func (c *Cluster) WaitFailover(ctx context.Context, addr string) error {
	c.mu.Lock()
	var live string
	for _, n := range c.nodes {
		select {
		case <-n.done:
		default:
			if n.Addr != addr && live == "" {
				live = n.Addr
			}
		}
	}
	c.mu.Unlock()
	err := poll(ctx, func() error {
		nodes, err := Do(ctx, live, "CLUSTER", "NODES")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) > 2 && strings.HasPrefix(f[1], addr+"@") {
				if !slices.Contains(strings.Split(f[2], ","), "fail") {
					return fmt.Errorf("%s is flagged %s, not fail", addr, f[2])
				}
				return nil
			}
		}
		return fmt.Errorf("%s not in CLUSTER NODES", addr)
	})
	if err != nil {
		return fmt.Errorf("testcluster: failover of %s: %w", addr, err)
	}
	return c.WaitHealthy(ctx)
}

func (c *Cluster) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		_ = n.cmd.Process.Kill()
	}
	for _, n := range c.nodes {
		<-n.done
	}
}

// Do sends one command to the Redis at addr on a new connection and returns
// its reply: the text of a simple string, bulk string or integer. An error
// reply is returned as an error.
func Do(ctx context.Context, addr string, args ...string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	deadline := time.Now().Add(5 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	_ = conn.SetDeadline(deadline)
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(conn, b.String()); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("bad bulk reply %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("unsupported reply %q", line)
}

// poll calls f every 50 ms until it returns nil or ctx ends.
func poll(ctx context.Context, f func() error) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// freePorts returns n distinct free loopback ports, held open together
// while they are chosen so that none is returned twice.
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
