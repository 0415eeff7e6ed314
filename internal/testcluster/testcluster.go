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
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 6 {
		n, err := startNode(ctx, filepath.Join(root, strconv.Itoa(i)), freePorts)
		if n != nil {
			c.mu.Lock()
			c.nodes = append(c.nodes, n)
			c.mu.Unlock()
		}
		if err != nil {
			tb.Fatal(err)
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

// startAttempts is how many times startNode tries new ports for a node
// whose redis-server exits at start: another test may take a port between
// the moment it was found free and the moment redis-server binds it.
const startAttempts = 3

// startNode starts one node in dir, on ports chosen by pick, and waits until it answers PING. A
// process that exits before answering is started again on new ports; after
// startAttempts, or when ctx ends, the error carries redis-server's own
// output. The node is returned whenever a process was started, so that the
// caller's cleanup stops it.
func startNode(ctx context.Context, dir string, pick func(n int) ([]int, error)) (*Node, error) {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	var n *Node
	for attempt := 1; ; attempt++ {
		ports, err := pick(2) // client port and cluster bus port
		if err != nil {
			return n, err
		}
		n = &Node{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), dir: dir}
		n.args = []string{
			"--port", strconv.Itoa(ports[0]), "--cluster-port", strconv.Itoa(ports[1]),
			"--bind", "127.0.0.1", "--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.Itoa(int(NodeTimeout.Milliseconds())),
			// Replicas sync at once, not after the default 5 s that
			// lets a master batch several of them.
			"--repl-diskless-sync-delay", "0",
			"--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning"}
		if err := n.start(); err != nil {
			return nil, err
		}
		err = poll(ctx, func() error {
			select {
			case <-n.done:
				return errExited
			default:
			}
			_, err := Do(ctx, n.Addr, "PING")
			return err
		})
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, errExited) || attempt == startAttempts {
			return n, fmt.Errorf("testcluster: redis-server %s (attempt %d of %d) did not answer PING: %w\n%s",
				n.Addr, attempt, startAttempts, err, n.output())
		}
		// The failed attempt's cluster configuration names its ports.
		_ = os.Remove(filepath.Join(dir, "nodes.conf"))
	}
}

// errExited says that a node's process ended while it was awaited.
var errExited = errors.New("redis-server exited")

func (n *Node) start() error {
	out, err := os.OpenFile(filepath.Join(n.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	n.cmd = exec.Command("redis-server", n.args...)
	n.cmd.Stdout, n.cmd.Stderr = out, out
	if err := n.cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("starting redis-server: %w", err)
	}
	done := make(chan struct{})
	n.done = done
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); out.Close(); close(done) }(n.cmd)
	return nil
}

// output returns the end of what the node's redis-server processes wrote,
// for an error message.
func (n *Node) output() string {
	b, err := os.ReadFile(filepath.Join(n.dir, "redis.log"))
	if err != nil {
		return "(no redis-server output: " + err.Error() + ")"
	}
	const limit = 4 << 10
	if len(b) > limit {
		b = b[len(b)-limit:]
	}
	return "---- redis-server output ----\n" + string(b)
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
			return fmt.Errorf("testcluster: node %s: %w\n%s", n.Addr, err, n.output())
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

// poll calls f every 50 ms until it returns nil or ctx ends, or at once
// when f says that the process it waits for exited (errExited).
func poll(ctx context.Context, f func() error) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		err := f()
		if err == nil || errors.Is(err, errExited) {
			return err
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
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
