package sqlitestore_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/sqlitestore"
)

// The test binary doubles as the child process of the multi-process tests:
// with IDEM_SQLITE_CHILD set, TestMain runs the child's role instead of the
// tests.
func TestMain(m *testing.M) {
	switch os.Getenv("IDEM_SQLITE_CHILD") {
	case "":
		os.Exit(leaked(m.Run()))
	case "claim":
		childClaim()
	case "crash":
		childCrash()
	}
	os.Exit(0)
}

// childClaim opens the store, says "ready", waits for "go" on stdin, then
// claims keys 0..n-1 and completes the ones it wins, printing one line
// per key: "<key> <outcome>".
func childClaim() {
	path, n := os.Getenv("IDEM_DB"), atoi(os.Getenv("IDEM_KEYS"))
	now := time.Unix(0, int64(atoi(os.Getenv("IDEM_NOW"))))
	ctx := context.Background()
	s, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	defer s.Close()
	fmt.Println("ready")
	bufio.NewReader(os.Stdin).ReadString('\n')
	for i := range n {
		key := strconv.Itoa(i)
		p := idemstore.ClaimParams{Scope: "s", Key: key, Fingerprint: "v1:x", Token: fmt.Sprint(os.Getpid(), "-", i),
			Lease: time.Minute, TTL: time.Hour, Now: now}
		r, err := s.Claim(ctx, p)
		if err != nil {
			fmt.Println(key, "error", err)
			continue
		}
		if r.Outcome == idemstore.ClaimAcquired {
			err := s.Complete(ctx, idemstore.CompleteParams{Scope: "s", Key: key, Token: p.Token, Now: now,
				Response: &idemstore.Response{StatusCode: 201, Body: []byte(strconv.Itoa(os.Getpid()))}})
			if err != nil {
				fmt.Println(key, "error", err)
				continue
			}
		}
		fmt.Println(key, r.Outcome)
	}
}

// childCrash claims a key, writes a business row and the completion in
// one transaction, says "ready" and waits to be killed before committing.
func childCrash() {
	ctx := context.Background()
	now := time.Unix(0, int64(atoi(os.Getenv("IDEM_NOW"))))
	s, err := sqlitestore.Open(ctx, os.Getenv("IDEM_DB"), nil)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	p := idemstore.ClaimParams{Scope: "s", Key: "crash", Fingerprint: "v1:x", Token: "doomed", Lease: time.Second, TTL: time.Hour, Now: now}
	if r, err := s.Claim(ctx, p); err != nil || r.Outcome != idemstore.ClaimAcquired {
		fmt.Println("error", r.Outcome, err)
		return
	}
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	if _, err := tx.Exec(`INSERT INTO payments (note) VALUES ('doomed')`); err != nil {
		fmt.Println("error", err)
		return
	}
	if err := s.CompleteTx(ctx, tx, idemstore.CompleteParams{Scope: "s", Key: "crash", Token: "doomed", Now: now,
		Response: &idemstore.Response{StatusCode: 201, Body: []byte("doomed")}}); err != nil {
		fmt.Println("error", err)
		return
	}
	fmt.Println("ready")
	select {} // killed here, before COMMIT
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

type child struct {
	cmd   *exec.Cmd
	stdin *os.File
	out   *bufio.Scanner
}

func startChild(t *testing.T, role string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, "IDEM_SQLITE_CHILD="+role)...)
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = stdinR
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stdinR.Close()
	c := &child{cmd: cmd, stdin: stdinW, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		c.stdin.Close()
		c.cmd.Process.Kill()
		c.cmd.Wait()
	})
	return c
}

func (c *child) line(t *testing.T) string {
	t.Helper()
	if !c.out.Scan() {
		t.Fatalf("child %d ended early: %v", c.cmd.Process.Pid, c.out.Err())
	}
	return c.out.Text()
}

// TestProcessesShareOneFile races four processes over the same keys on one
// file: every key has exactly one owner, and every other process sees its
// record.
func TestProcessesShareOneFile(t *testing.T) {
	t.Parallel()
	s, path := open(t) // creates and migrates the file first
	const procs, keys = 4, 60
	now := strconv.FormatInt(time.Now().UnixNano(), 10)
	children := make([]*child, procs)
	for i := range children {
		children[i] = startChild(t, "claim", "IDEM_DB="+path, "IDEM_KEYS="+strconv.Itoa(keys), "IDEM_NOW="+now)
	}
	for _, c := range children {
		if l := c.line(t); l != "ready" {
			t.Fatalf("child: %s", l)
		}
	}
	for _, c := range children {
		fmt.Fprintln(c.stdin, "go")
	}
	outcomes := make(map[string]map[string]int)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, c := range children {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range keys {
				if !c.out.Scan() {
					t.Errorf("child ended early")
					return
				}
				f := strings.Fields(c.out.Text())
				mu.Lock()
				if outcomes[f[0]] == nil {
					outcomes[f[0]] = map[string]int{}
				}
				outcomes[f[0]][f[1]]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for k := range keys {
		o := outcomes[strconv.Itoa(k)]
		if o["acquired"] != 1 || o["acquired"]+o["completed"]+o["in_flight"] != procs {
			t.Errorf("key %d: outcomes %v, want exactly one acquired of %d", k, o, procs)
		}
	}
	// Every record was completed by its single owner.
	r, err := s.Claim(context.Background(), idemstore.ClaimParams{Scope: "s", Key: "7", Fingerprint: "v1:x", Token: "parent",
		Lease: time.Minute, TTL: time.Hour, Now: time.Now()})
	if err != nil || r.Outcome != idemstore.ClaimCompleted {
		t.Fatalf("parent sees %v %v", r.Outcome, err)
	}
}

// TestKilledProcessLeavesNoBusinessRow kills a process with SIGKILL after
// its business write and completion, before its commit: the claim survives
// (committed first, in its own transaction), the payment and the response
// do not. After the lease, a retry takes over and executes exactly once.
func TestKilledProcessLeavesNoBusinessRow(t *testing.T) {
	t.Parallel()
	s, path := open(t)
	business(t, s)
	start := time.Now()
	c := startChild(t, "crash", "IDEM_DB="+path, "IDEM_NOW="+strconv.FormatInt(start.UnixNano(), 10))
	if l := c.line(t); l != "ready" {
		t.Fatalf("child: %s", l)
	}
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.cmd.Wait()

	if n := countPayments(t, s); n != 0 {
		t.Fatalf("%d payments after the crash, want 0", n)
	}
	ctx := context.Background()
	p := idemstore.ClaimParams{Scope: "s", Key: "crash", Fingerprint: "v1:x", Token: "retry", Lease: time.Second, TTL: time.Hour, Now: start}
	if r, err := s.Claim(ctx, p); err != nil || r.Outcome != idemstore.ClaimInFlight {
		t.Fatalf("retry within the dead owner's lease: %v %v", r.Outcome, err)
	}
	p.Now = start.Add(2 * time.Second)
	// A take-over gets takeOverWait (100 ms) for the write lock and its
	// commit, and answers in_flight when that runs out, as it may on a
	// loaded machine: the client retries, as a real one would, a bounded
	// number of times.
	var (
		r   idemstore.ClaimResult
		err error
	)
	for attempt := 0; attempt < 50; attempt++ {
		if r, err = s.Claim(ctx, p); err != nil || r.Outcome != idemstore.ClaimInFlight {
			break
		}
	}
	if err != nil || r.Outcome != idemstore.ClaimAcquired || !r.TookOver {
		t.Fatalf("retry after the lease: %+v %v", r, err)
	}
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(`INSERT INTO payments (note) VALUES ('retry')`); err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteTx(ctx, tx, idemstore.CompleteParams{Scope: "s", Key: "crash", Token: "retry", Now: p.Now,
		Response: &idemstore.Response{StatusCode: 201, Body: []byte("retry")}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if n := countPayments(t, s); n != 1 {
		t.Fatalf("%d payments, want exactly 1", n)
	}
}

func TestConcurrentOpenMigratesOnce(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "m.db")
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := sqlitestore.Open(context.Background(), path, nil)
			if err == nil {
				s.Close()
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}
