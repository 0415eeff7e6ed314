package datalayertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemhq/idem/examples/internal/datalayer"
	"github.com/idemhq/idem/idemstore"
)

// A backend is one row of the table the tests run on: the example's
// backend and how a test gets a fresh, empty database on it (skipping the
// test when the server is unreachable and CI is unset).
type backend struct {
	*datalayer.Backend
	fresh func(t *testing.T) string
}

var backends = []backend{
	{datalayer.SQLite, func(t *testing.T) string { return filepath.Join(t.TempDir(), "app.db") }},
	{datalayer.Postgres, freshPostgres},
	{datalayer.MySQL, freshMySQL},
}

// Run runs lib's both-or-neither test on every backend, with a separate
// claim and with Config.ClaimInTx, and checks that the test fails when the
// library writes outside the execution's transaction.
func Run(t *testing.T, lib datalayer.Library) {
	for _, b := range backends {
		t.Run(b.Name, func(t *testing.T) {
			t.Parallel()
			for _, claimInTx := range []bool{false, true} {
				name := "separate-claim"
				if claimInTx {
					name = "claim-in-tx"
				}
				t.Run(name, func(t *testing.T) {
					t.Parallel()
					if err := bothOrNeither(t, b, spec{ClaimInTx: claimInTx}); err != nil {
						t.Fatal(err)
					}
				})
			}
			t.Run("outside-the-transaction-fails", func(t *testing.T) {
				t.Parallel()
				err := bothOrNeither(t, b, spec{Outside: true})
				if err == nil {
					t.Fatal("the check passed writes sent outside the execution's transaction")
				}
				t.Logf("writes outside the execution's transaction fail the check, as they must: %v", err)
			})
		})
	}
}

// The request every scenario sends.
const (
	key  = "order-7f3a"
	body = `{"item":"book","quantity":2}`
)

// bothOrNeither kills a child after the handler's write and before the
// commit, checks that neither the order nor a stored response survived,
// retries until the request executes, checks that both exist, and retries
// again for a byte-exact replay that writes nothing. It fails t when the
// machinery fails, and returns the first check that did not hold.
func bothOrNeither(t *testing.T, b backend, s spec) error {
	ctx := t.Context()
	s.Backend, s.DSN = b.Name, b.fresh(t)
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	db, err := b.Open(octx, s.DSN)
	cancel()
	if err != nil {
		t.Fatalf("open %s: %v", b.Name, err)
	}
	t.Cleanup(func() { db.Close() })
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: time.Minute}

	// 1. Killed between the write and the commit.
	crashing := s
	crashing.Crash = true
	p := start(t, crashing)
	sent := make(chan error, 1)
	go func() {
		resp, err := post(ctx, client, p.url)
		if err == nil {
			err = fmt.Errorf("got %d %q from the process that should have died", resp.status, resp.body)
		} else {
			err = nil
		}
		sent <- err
	}()
	p.await(t, "complete")
	p.kill(t)
	if err := <-sent; err != nil {
		return err
	}
	n := orders(t, db)
	recs := records(t, db)
	if n != 0 {
		return fmt.Errorf("after the kill: %d orders, want 0 (the write committed without the execution's transaction; records: %s)", n, recs)
	}
	if s.ClaimInTx && len(recs) != 0 {
		return fmt.Errorf("after the kill: records %s, want none (the claim is in the transaction)", recs)
	}
	if !s.ClaimInTx && (len(recs) != 1 || recs[0].State != idemstore.StateInFlight || recs[0].ResponseSize != 0) {
		return fmt.Errorf("after the kill: records %s, want one in flight without a response", recs)
	}

	// 2. The retry executes (taking over the killed claim) and commits both.
	p = start(t, s)
	first := retry(t, ctx, client, p.url)
	if first.status != http.StatusCreated || first.replayed {
		return fmt.Errorf("retry: %d replayed=%v %q, want a first execution's 201", first.status, first.replayed, first.body)
	}
	var o datalayer.Order
	if err := json.Unmarshal(first.body, &o); err != nil || o.ID == 0 || o.Item != "book" || o.Quantity != 2 {
		return fmt.Errorf("retry: body %q (%v), want the created order", first.body, err)
	}
	if n, recs := orders(t, db), records(t, db); n != 1 || len(recs) != 1 || recs[0].State != idemstore.StateCompleted || recs[0].ResponseSize == 0 {
		return fmt.Errorf("after the retry: %d orders, records %s; want 1 order and one completed record", n, recs)
	}

	// 3. The next retry replays without writing.
	again, err := post(ctx, client, p.url)
	if err != nil {
		t.Fatal(err)
	}
	if again.status != first.status || !again.replayed || !bytes.Equal(again.body, first.body) {
		return fmt.Errorf("replay: %d replayed=%v %q, want %d replayed=true %q", again.status, again.replayed, again.body, first.status, first.body)
	}
	if n := orders(t, db); n != 1 {
		return fmt.Errorf("after the replay: %d orders, want 1", n)
	}
	p.stop(t)
	return nil
}

type answer struct {
	status   int
	replayed bool
	body     []byte
}

func post(ctx context.Context, c *http.Client, url string) (answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/orders", strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", `"`+key+`"`)
	resp, err := c.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header.Get("Idempotency-Replayed") == "true", b}, err
}

// retry posts until the answer is not a 409 (the killed claim's lease
// still running), for at most a minute.
func retry(t *testing.T, ctx context.Context, c *http.Client, url string) answer {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(lease / 10)
	defer tick.Stop()
	for {
		a, err := post(ctx, c, url)
		if err != nil {
			t.Fatal(err)
		}
		if a.status != http.StatusConflict {
			return a
		}
		if time.Now().After(deadline) {
			t.Fatalf("still 409 after a minute: %q", a.body)
		}
		<-tick.C
	}
}

func orders(t *testing.T, db *datalayer.DB) int {
	t.Helper()
	var n int
	if err := db.SQL.QueryRowContext(t.Context(), `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatalf("count orders: %v", err)
	}
	return n
}

type recordList []idemstore.RecordInfo

func (l recordList) String() string {
	parts := []string{}
	for _, r := range l {
		parts = append(parts, fmt.Sprintf("{%s, response %d bytes}", r.State, r.ResponseSize))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// records lists the records of the scenario's key, through the store's
// Inspector.
func records(t *testing.T, db *datalayer.DB) recordList {
	t.Helper()
	page, err := db.Store.(idemstore.Inspector).List(t.Context(), idemstore.ListParams{Key: key, Limit: 10, Now: time.Now()})
	if err != nil {
		t.Fatalf("list records: %v", err)
	}
	if page.Next != "" {
		t.Fatalf("list records: a second page (%q) for one key", page.Next)
	}
	return page.Records
}

// proc is a child process serving the example.
type proc struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	out     *lines
	errBuf  *lockedWriter
	url     string
	done    chan struct{} // closed when the process has ended
	waitErr error         // cmd.Wait's, once done is closed
}

// start starts a child with s and waits until it listens.
func start(t *testing.T, s spec) *proc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(s)
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(js))
	p := &proc{cmd: cmd, out: newLines(), errBuf: &lockedWriter{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.errBuf
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.waitErr = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	addr := p.await(t, "listening ")
	p.url = "http://" + strings.TrimPrefix(addr, "listening ")
	return p
}

// await waits up to a minute for a line of the child's output that starts
// with prefix, and returns it.
func (p *proc) await(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	for {
		select {
		case l := <-p.out.c:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-p.done:
			// Output written before the exit is already queued.
			for {
				select {
				case l := <-p.out.c:
					if strings.HasPrefix(l, prefix) {
						return l
					}
				default:
					t.Fatalf("the child exited (%v) before printing %q; stderr:\n%s", p.waitErr, prefix, p.errBuf)
				}
			}
		case <-timeout.C:
			t.Fatalf("no %q from the child within a minute; stderr:\n%s", prefix, p.errBuf)
		}
	}
}

// kill sends SIGKILL and waits for the process to end.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the child ended with %v, not by SIGKILL; stderr:\n%s", p.waitErr, p.errBuf)
	}
}

// stop closes the child's standard input, which makes it exit, and waits
// up to a minute.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	_ = p.stdin.Close()
	timeout := time.NewTimer(time.Minute)
	defer timeout.Stop()
	select {
	case <-p.done:
		if p.waitErr != nil {
			t.Fatalf("the child: %v; stderr:\n%s", p.waitErr, p.errBuf)
		}
	case <-timeout.C:
		t.Fatalf("the child did not exit within a minute of its stdin closing")
	}
}

// lines is the child's standard output, split into lines on a channel.
type lines struct {
	mu   sync.Mutex
	part []byte
	c    chan string
}

func newLines() *lines { return &lines{c: make(chan string, 64)} }

func (l *lines) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.part = append(l.part, b...)
	for {
		i := bytes.IndexByte(l.part, '\n')
		if i < 0 {
			return len(b), nil
		}
		select {
		case l.c <- string(l.part[:i]):
		default: // nobody reads that much; drop
		}
		l.part = l.part[i+1:]
	}
}

// lockedWriter is the child's standard error, kept for failure messages.
type lockedWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *lockedWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(b)
}

func (w *lockedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}
