package testcluster

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func needRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
}

// takenPorts returns a pick function whose first calls return ports that a
// listener of the test holds, then free ones.
func takenPorts(t *testing.T, taken int) func(int) ([]int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	port := ln.Addr().(*net.TCPAddr).Port
	calls := 0
	return func(n int) ([]int, error) {
		calls++
		if calls <= taken {
			free, err := freePorts(n - 1)
			return append([]int{port}, free...), err
		}
		return freePorts(n)
	}
}

func stopNode(n *Node) {
	if n != nil {
		_ = n.cmd.Process.Kill()
		<-n.done
	}
}

// A port taken between the moment it was found free and redis-server's bind
// (another test's process) costs one more attempt, not the run.
func TestStartNodeRetriesATakenPort(t *testing.T) {
	t.Parallel()
	needRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n, err := startNode(ctx, t.TempDir()+"/node", takenPorts(t, 1))
	defer stopNode(n)
	if err != nil {
		t.Fatalf("startNode: %v", err)
	}
	if _, err := Do(ctx, n.Addr, "PING"); err != nil {
		t.Fatalf("PING %s: %v", n.Addr, err)
	}
}

// A node that cannot start fails at once with redis-server's own words,
// instead of waiting out the deadline with nothing to show.
func TestStartNodeFailsFastWithTheServersOutput(t *testing.T) {
	t.Parallel()
	needRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	n, err := startNode(ctx, t.TempDir()+"/node", takenPorts(t, startAttempts))
	defer stopNode(n)
	if err == nil {
		t.Fatal("startNode succeeded on a taken port")
	}
	if !strings.Contains(err.Error(), "redis-server output") || !strings.Contains(strings.ToLower(err.Error()), "address already in use") {
		t.Errorf("error does not carry redis-server's output:\n%v", err)
	}
	if ctx.Err() != nil {
		t.Errorf("startNode waited for the deadline (%v) instead of noticing the exit", time.Since(start))
	}
}
