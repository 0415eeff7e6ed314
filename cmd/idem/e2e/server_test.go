package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Bounds on waiting for a server process.
const (
	startTimeout = 60 * time.Second // a -race binary migrating a fresh database
	stopTimeout  = 40 * time.Second // beyond the server's own 30 s shutdown bound
)

// server is one running `idem serve` process.
type server struct {
	name string
	url  string // http://127.0.0.1:PORT
	addr string // 127.0.0.1:PORT
	cmd  *exec.Cmd
	log  *serverLog

	exited  chan struct{} // closed when the process has exited
	waitErr error         // the exit status, once exited is closed
	killed  bool          // the test killed it on purpose
}

// startServer runs `idem serve --addr 127.0.0.1:0 --log-format json` with
// args, waits until it logs the address it listens on, and stops it when
// the test ends (gracefully, then by force). The test fails if the process
// reports a data race or a graceful stop ends with a non-zero status.
func startServer(t *testing.T, name string, args ...string) *server {
	t.Helper()
	return startCommand(t, name, "serve", args...)
}

// startCommand is startServer for any idem command that logs
// "idem COMMAND listening" (serve, proxy, consume).
func startCommand(t *testing.T, name, command string, args ...string) *server {
	t.Helper()
	return startIdem(t, name, nil, append([]string{command, "--addr", "127.0.0.1:0", "--log-format", "json"}, args...)...)
}

// startIdem runs the idem binary with args (a subcommand that logs JSON and
// announces its address: serve, proxy, consume or provider) and env added
// to the test's environment, as startServer describes.
func startIdem(t *testing.T, name string, env []string, args ...string) *server {
	t.Helper()
	began := time.Now()
	s := spawnIdem(t, name, env, args...)
	s.awaitListening(t, began)
	return s
}

// spawnIdem starts the process as startIdem does, without waiting for it
// to listen (awaitListening does), so that a test can start several at
// the same moment.
func spawnIdem(t *testing.T, name string, env []string, args ...string) *server {
	t.Helper()
	s := &server{name: name, log: newServerLog(), exited: make(chan struct{})}
	s.cmd = exec.Command(binary(t), args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.Env = append(os.Environ(), env...)
	if raceEnabled && os.Getenv("GORACE") == "" {
		// A -race binary sleeps a second at exit by default, waiting for
		// late reports; this suite stops a dozen processes.
		s.cmd.Env = append(s.cmd.Env, "GORACE=atexit_sleep_ms=0")
	}
	s.cmd.WaitDelay = 5 * time.Second // bound the copying of output after exit
	killWithParent(s.cmd)
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		s.waitErr = s.cmd.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() { s.cleanup(t) })
	return s
}

// awaitListening waits until the process logs the address it listens on
// (failing the test if it exits first or takes longer than startTimeout),
// and sets s.addr and s.url.
func (s *server) awaitListening(t *testing.T, began time.Time) {
	t.Helper()
	name := s.name
	timer := time.NewTimer(startTimeout)
	defer timer.Stop()
	select {
	case s.addr = <-s.log.listening:
	case <-s.exited:
		t.Fatalf("%s exited at start (%v); log:\n%s", name, s.waitErr, s.log.tail(30))
	case <-timer.C:
		t.Fatalf("%s did not log its address within %v; log:\n%s", name, startTimeout, s.log.tail(30))
	}
	s.url = "http://" + s.addr
	t.Logf("%s listening on %s after %v", name, s.addr, time.Since(began).Round(time.Millisecond))
}

// cleanup stops the process and reports what it logged if the test
// failed.
func (s *server) cleanup(t *testing.T) {
	began := time.Now()
	if err := s.stop(); err != nil {
		t.Errorf("%s: %v", s.name, err)
	}
	t.Logf("%s stopped in %v", s.name, time.Since(began).Round(time.Millisecond))
	if s.log.contains("WARNING: DATA RACE") {
		t.Errorf("%s reported a data race; log:\n%s", s.name, s.log.tail(200))
	} else if t.Failed() {
		t.Logf("%s log (last lines):\n%s", s.name, s.log.tail(30))
	}
}

// stop ends the process with SIGTERM (a graceful shutdown) and returns an
// error if it does not exit in time or exits with a non-zero status. A
// process the test killed is only waited for.
func (s *server) stop() error {
	select {
	case <-s.exited:
		if s.killed {
			return nil
		}
		return fmt.Errorf("exited before the test stopped it: %v", s.waitErr)
	default:
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM: %w", err)
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-s.exited:
	case <-timer.C:
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("did not stop within %v of SIGTERM; killed", stopTimeout)
	}
	if s.waitErr != nil {
		return fmt.Errorf("graceful stop: %w", s.waitErr)
	}
	return nil
}

// kill ends the process with SIGKILL, as a crash would, and waits for it.
func (s *server) kill(t *testing.T) {
	t.Helper()
	s.killed = true
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL %s: %v", s.name, err)
	}
	<-s.exited
}

// metric returns the value of the unlabelled sample name on /metrics.
func (s *server) metric(name string) (float64, error) {
	resp, err := httpClient.Get(s.url + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("%s /metrics: %w", s.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s /metrics: status %d", s.name, resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s /metrics: %w", s.name, err)
	}
	return 0, fmt.Errorf("%s /metrics: no sample %s", s.name, name)
}

// mustMetric is metric that fails the test on error.
func (s *server) mustMetric(t *testing.T, name string) float64 {
	t.Helper()
	v, err := s.metric(name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// maxLogBytes bounds the log kept per process; a runaway server cannot
// exhaust the test's memory.
const maxLogBytes = 8 << 20

// serverLog collects a process's output and announces the address of its
// JSON line {"msg":"idem serve listening","addr":"..."} (or idem proxy's).
type serverLog struct {
	listening chan string // receives the address once

	mu      sync.Mutex
	buf     bytes.Buffer
	scanned int // bytes of buf already searched for the listening line
	found   bool
	// grew is closed, and replaced, whenever output arrives (waitLine).
	grew chan struct{}
}

func newServerLog() *serverLog {
	return &serverLog{listening: make(chan string, 1), grew: make(chan struct{})}
}

// Write implements io.Writer; exec copies the process output into it.
func (l *serverLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buf.Len()+len(p) <= maxLogBytes {
		l.buf.Write(p)
	}
	close(l.grew)
	l.grew = make(chan struct{})
	for !l.found {
		rest := l.buf.Bytes()[l.scanned:]
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		l.scanned += i + 1
		var line struct{ Msg, Addr string }
		if json.Unmarshal(rest[:i], &line) == nil && line.Addr != "" && (line.Msg == "idem serve listening" ||
			line.Msg == "idem proxy listening" || line.Msg == "idem consume listening" || line.Msg == "idem provider listening" ||
			line.Msg == "idem console listening") {
			l.found = true
			l.listening <- line.Addr
		}
	}
	return len(p), nil
}

// contains reports whether the output contains s.
func (l *serverLog) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Contains(l.buf.Bytes(), []byte(s))
}

// waitLine returns the last line of the output that holds every one of
// want, waiting up to timeout for it to arrive: the process writes a log
// line before it answers, but the test reads the output through a pipe
// that exec copies in its own goroutine, so an answer can arrive first.
// It fails the test when no such line arrives in time.
func (l *serverLog) waitLine(t *testing.T, timeout time.Duration, want ...string) string {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		lines := strings.Split(l.buf.String(), "\n")
		grew := l.grew
		l.mu.Unlock()
		for i := len(lines) - 1; i >= 0; i-- {
			if containsAll(lines[i], want) {
				return lines[i]
			}
		}
		select {
		case <-grew:
		case <-deadline.C:
			t.Fatalf("no log line with %q within %v; log:\n%s", want, timeout, l.tail(20))
			return ""
		}
	}
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// tail returns the last n lines of the output.
func (l *serverLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	lines := strings.Split(strings.TrimRight(l.buf.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// httpClient is for the tests' sequential requests; bursts use a client
// per request (see burst).
var httpClient = &http.Client{Timeout: 60 * time.Second}

// eventually polls cond every interval until it returns true, and fails
// the test after timeout. It is for conditions that need real time to pass
// (a lease to run out, a connection to be re-established); cond's error is
// reported if it never succeeds.
func eventually(t *testing.T, timeout, interval time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %v (last error: %v)", what, timeout, lastErr)
		}
		<-tick.C
	}
}

// drain reads and closes a response body so that its connection can be
// reused.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}
