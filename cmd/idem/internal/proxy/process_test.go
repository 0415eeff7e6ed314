package proxy

// Tests that drive the real idem binary: `idem proxy` processes on free
// ports, in front of a counting upstream in this test process, on real
// SQLite files, PostgreSQL schemas and Redis prefixes.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemhq/idem"
)

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(leaked(code))
}

// idemBinary builds the idem command once per test run.
func idemBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "idem-proxy-test-"); binErr != nil {
			return
		}
		goTool, err := exec.LookPath("go")
		if err != nil {
			t.Fatalf("the go command is not on PATH: %v", err)
		}
		binPath = filepath.Join(binDir, "idem")
		out, err := exec.Command(goTool, "build", "-o", binPath, "github.com/idemhq/idem/cmd/idem").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// childEnv is this process's environment without IDEM_* variables, which
// the command would read as flags.
func childEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEM_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// logLines collects a process's log lines and lets tests wait for one.
type logLines struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{}
}

func (l *logLines) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, s)
	close(l.changed)
	l.changed = make(chan struct{})
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// find returns the first line containing substr.
func (l *logLines) find(substr string) (string, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.lines {
		if strings.Contains(s, substr) {
			return s, nil
		}
	}
	return "", l.changed
}

// proc is a running `idem proxy`.
type proc struct {
	name string
	cmd  *exec.Cmd
	url  string
	logs *logLines
	done chan struct{} // closed when the process has exited
	err  error         // its exit error, once done
}

// runIdem starts the idem binary with args and collects its stderr.
func runIdem(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(idemBinary(t), args...)
	cmd.Env = childEnv(env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, logs: &logLines{changed: make(chan struct{})}, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.logs.add(sc.Text())
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("logs of %s:\n%s", name, p.logs)
		}
	})
	return p
}

// startProxy starts `idem proxy` on a free port with a 1 s lease and JSON
// logs, and waits until it listens.
func startProxy(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	base := []string{"proxy", "--addr", "127.0.0.1:0", "--log-format", "json", "--lease", "1s", "--cleanup-interval", "0"}
	p := runIdem(t, name, nil, append(base, args...)...)
	line := p.waitLog(t, `"msg":"idem proxy listening"`)
	var start struct{ Addr string }
	if err := json.Unmarshal([]byte(line), &start); err != nil || start.Addr == "" {
		t.Fatalf("%s: start line %q: %v", name, line, err)
	}
	p.url = "http://" + start.Addr
	return p
}

// waitLog waits for a log line containing substr; it fails the test if
// the process exits first or nothing comes within 20 s.
func (p *proc) waitLog(t *testing.T, substr string) string {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		line, changed := p.logs.find(substr)
		if changed == nil {
			return line
		}
		select {
		case <-changed:
		case <-p.done:
			if line, changed := p.logs.find(substr); changed == nil {
				return line
			}
			t.Fatalf("%s exited (%v) before logging %s:\n%s", p.name, p.err, substr, p.logs)
		case <-deadline:
			t.Fatalf("%s did not log %s within 20s:\n%s", p.name, substr, p.logs)
		}
	}
}

func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(40 * time.Second):
		t.Fatalf("%s did not exit", p.name)
	}
	return p.cmd.ProcessState.ExitCode()
}

// gate holds upstream requests until it is opened (once, also in cleanup).
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{ch: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// held answers like the default upstream once the gate opens.
func (g *gate) held(w http.ResponseWriter, r *http.Request, n int) {
	select {
	case <-g.ch:
	case <-r.Context().Done():
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"key": r.Header.Get(idem.HeaderKey), "n": n})
}

// TestProcessDuplicatesReachUpstreamOnce sends simultaneous duplicates
// through two proxy processes sharing one store: while the first is held
// at the upstream every other gets 409, the upstream runs once, and every
// later retry, through either proxy, replays.
func TestProcessDuplicatesReachUpstreamOnce(t *testing.T) {
	t.Parallel()
	for name, spec := range map[string]func(t *testing.T) string{
		"sqlite":   func(t *testing.T) string { return filepath.Join(t.TempDir(), "records.db") },
		"postgres": func(t *testing.T) string { return postgresSpec(t) },
		"mysql":    func(t *testing.T) string { return mysqlSpec(t) },
		"redis":    func(t *testing.T) string { return redisSpec(t) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store := spec(t)
			g := newGate(t)
			up := newUpstream(t, g.held)
			a := startProxy(t, "A", "--store", store, "--upstream", up.URL)
			b := startProxy(t, "B", "--store", store, "--upstream", up.URL)
			key := newKey(t)
			const n = 24
			results := make(chan reply, n)
			for i := range n {
				target := a.url
				if i%2 == 1 {
					target = b.url
				}
				go func() {
					r, err := trySend(http.MethodPost, target+"/payments", `{"amount":42}`, idem.HeaderKey, key, "Authorization", "Bearer t1")
					if err != nil {
						r = reply{status: -1, body: err.Error()}
					}
					results <- r
				}()
			}
			var got []reply
			timeout := time.After(20 * time.Second)
			for len(got) < n-1 {
				select {
				case r := <-results:
					got = append(got, r)
				case <-timeout:
					g.open()
					t.Fatalf("only %d of %d duplicates were answered while the first was running; upstream ran %d times", len(got), n-1, up.count(key))
				}
			}
			for _, r := range got {
				if r.status != http.StatusConflict || r.problemCode() != idem.CodeRequestInProgress {
					t.Fatalf("a duplicate of a running request got %v", r)
				}
			}
			g.open()
			first := <-results
			if first.status != http.StatusCreated || first.header.Get(idem.HeaderReplayed) != "false" {
				t.Fatalf("the executing request got %v", first)
			}
			for _, target := range []string{a.url, b.url} {
				r := send(t, http.MethodPost, target+"/payments", `{"amount":42}`, idem.HeaderKey, key, "Authorization", "Bearer t1")
				if r.status != http.StatusCreated || r.body != first.body || r.header.Get(idem.HeaderReplayed) != "true" {
					t.Fatalf("retry via %s: %v", target, r)
				}
			}
			if c := up.count(key); c != 1 {
				t.Fatalf("the upstream ran the request %d times", c)
			}
		})
	}
}

// TestProcessWaitModeReplaysToDuplicates: with --wait, duplicates sent to
// two processes wait for the first and all receive its response.
func TestProcessWaitModeReplaysToDuplicates(t *testing.T) {
	t.Parallel()
	store := filepath.Join(t.TempDir(), "records.db")
	g := newGate(t)
	up := newUpstream(t, g.held)
	a := startProxy(t, "A", "--store", store, "--upstream", up.URL, "--wait", "15s")
	b := startProxy(t, "B", "--store", store, "--upstream", up.URL, "--wait", "15s")
	key := newKey(t)
	const n = 20
	results := make(chan reply, n)
	for i := range n {
		target := []string{a.url, b.url}[i%2]
		go func() {
			r, err := trySend(http.MethodPost, target+"/orders", `{"sku":"x"}`, idem.HeaderKey, key)
			if err != nil {
				r = reply{status: -1, body: err.Error()}
			}
			results <- r
		}()
	}
	up.waitHit(t)
	g.open()
	var body string
	for range n {
		r := <-results
		if r.status != http.StatusCreated {
			t.Fatalf("a waiting duplicate got %v", r)
		}
		if body == "" {
			body = r.body
		} else if r.body != body {
			t.Fatalf("bodies differ: %q vs %q", r.body, body)
		}
	}
	if c := up.count(key); c != 1 {
		t.Fatalf("the upstream ran %d times", c)
	}
}

// TestProcessOutcomes covers one proxy process's answers: 400 without a
// key, 422 for a reused key, 5xx released and retried, GET untouched.
func TestProcessOutcomes(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Path == "/flaky" && n == 1 {
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "boom"})
			return
		}
		writeJSON(w, http.StatusCreated, map[string]any{"n": n, "path": r.URL.Path})
	})
	p := startProxy(t, "A", "--store", filepath.Join(t.TempDir(), "records.db"), "--upstream", up.URL)

	t.Run("key missing", func(t *testing.T) {
		r := send(t, http.MethodPost, p.url+"/payments", `{}`)
		if r.status != http.StatusBadRequest || r.problemCode() != idem.CodeKeyMissing {
			t.Fatalf("%v", r)
		}
	})
	t.Run("reused key with another payload", func(t *testing.T) {
		key := newKey(t)
		send(t, http.MethodPost, p.url+"/payments", `{"amount":1}`, idem.HeaderKey, key)
		r := send(t, http.MethodPost, p.url+"/payments", `{"amount":2}`, idem.HeaderKey, key)
		if r.status != http.StatusUnprocessableEntity || r.problemCode() != idem.CodeKeyReused {
			t.Fatalf("%v", r)
		}
		if c := up.count(key); c != 1 {
			t.Fatalf("upstream ran %d times", c)
		}
	})
	t.Run("5xx is released", func(t *testing.T) {
		key := newKey(t)
		if r := send(t, http.MethodPost, p.url+"/flaky", `{}`, idem.HeaderKey, key); r.status != http.StatusInternalServerError {
			t.Fatalf("%v", r)
		}
		if r := send(t, http.MethodPost, p.url+"/flaky", `{}`, idem.HeaderKey, key); r.status != http.StatusCreated || r.header.Get(idem.HeaderReplayed) != "false" {
			t.Fatalf("retry: %v", r)
		}
		if c := up.count(key); c != 2 {
			t.Fatalf("upstream ran %d times, want 2", c)
		}
	})
	t.Run("GET passes through", func(t *testing.T) {
		r := send(t, http.MethodGet, p.url+"/payments/1", "")
		if r.status != http.StatusCreated || r.header.Get(idem.HeaderReplayed) != "" {
			t.Fatalf("%v", r)
		}
	})
}

func TestProcessUnreachableUpstreamReleases(t *testing.T) {
	t.Parallel()
	addr := closedAddr(t)
	p := startProxy(t, "A", "--store", filepath.Join(t.TempDir(), "records.db"), "--upstream", "http://"+addr)
	key := newKey(t)
	r := send(t, http.MethodPost, p.url+"/payments", `{"amount":5}`, idem.HeaderKey, key)
	if r.status != http.StatusBadGateway || r.problemCode() != CodeUpstreamUnreachable || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("unreachable upstream: %v", r)
	}
	up := newUpstreamOn(t, listenOn(t, addr), nil)
	r = send(t, http.MethodPost, p.url+"/payments", `{"amount":5}`, idem.HeaderKey, key)
	if r.status != http.StatusCreated || r.header.Get(idem.HeaderReplayed) != "false" || up.count(key) != 1 {
		t.Fatalf("retry once the upstream is up: %v", r)
	}
}

// TestProcessStoreUnreachableAtStart: a store that cannot be reached at
// start-up (Redis as PostgreSQL) stops the proxy with a clear error and
// status 1; once running, an unreachable store answers 503 (see the
// frozen-store tests in cmd/idem/e2e).
func TestProcessStoreUnreachableAtStart(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	for _, store := range []string{"redis://" + closedAddr(t) + "/0", "postgres://postgres@" + closedAddr(t) + "/x?sslmode=disable",
		"mysql://root@" + closedAddr(t) + "/x"} {
		p := runIdem(t, "A", nil, "proxy", "--addr", "127.0.0.1:0", "--store", store, "--upstream", up.URL)
		if code := p.wait(t); code != 1 {
			t.Fatalf("%s: exit %d, want 1:\n%s", store, code, p.logs)
		}
		if line, _ := p.logs.find("cannot connect"); line == "" {
			t.Fatalf("%s: no clear error:\n%s", store, p.logs)
		}
	}
}

// TestProcessRefusesItselfAsUpstream: an upstream that is the proxy's own
// address would loop until file descriptors run out; the proxy refuses to
// start.
func TestProcessRefusesItselfAsUpstream(t *testing.T) {
	t.Parallel()
	addr := closedAddr(t)
	_, port, _ := strings.Cut(addr, ":")
	for _, c := range []struct{ listen, upstream string }{
		{addr, "http://" + addr},
		{addr, "http://localhost:" + port + "/api"},
		{"0.0.0.0:" + port, "http://127.0.0.1:" + port},
	} {
		p := runIdem(t, "A", nil, "proxy", "--addr", c.listen, "--store", "memory", "--upstream", c.upstream)
		if code := p.wait(t); code != 1 {
			t.Fatalf("--addr %s --upstream %s: exit %d, want 1:\n%s", c.listen, c.upstream, code, p.logs)
		}
		if line, _ := p.logs.find("the upstream is the proxy's own address"); line == "" {
			t.Fatalf("--addr %s --upstream %s: no clear error:\n%s", c.listen, c.upstream, p.logs)
		}
	}
}

// TestProcessScopeNoneIsLogged: scope none is an explicit choice, logged
// as a warning at start-up; by default a request without Authorization
// is refused.
func TestProcessScopeNoneIsLogged(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	p := startProxy(t, "default", "--store", "memory", "--upstream", up.URL)
	if r := send(t, http.MethodPost, p.url+"/payments", `{}`, idem.HeaderKey, newKey(t), "Authorization", ""); r.problemCode() != CodeScopeMissing {
		t.Fatalf("default scope, no Authorization: %v", r)
	}
	if line, _ := p.logs.find("not scoped"); line != "" {
		t.Fatalf("a warning without scope none: %s", line)
	}
	q := startProxy(t, "none", "--store", "memory", "--upstream", up.URL, "--scope-header", "none")
	line := q.waitLog(t, "not scoped")
	if !strings.Contains(line, `"level":"WARN"`) || !strings.Contains(line, "default") {
		t.Fatalf("warning: %s", line)
	}
	if start := q.waitLog(t, "idem proxy listening"); !strings.Contains(start, `"scope_header":"none"`) {
		t.Fatalf("start line: %s", start)
	}
	key := newKey(t)
	a := send(t, http.MethodPost, q.url+"/payments", `{}`, idem.HeaderKey, key, "Authorization", "")
	b := send(t, http.MethodPost, q.url+"/payments", `{}`, idem.HeaderKey, key, "Authorization", "")
	if a.status != http.StatusCreated || b.header.Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("scope none: %v / %v", a, b)
	}
}

// TestProcessKilledMidRequest: a proxy killed while the upstream works
// leaves its record in flight; through the other proxy a retry gets 409
// until the lease passes, then runs again (at-least-once after a crash).
func TestProcessKilledMidRequest(t *testing.T) {
	t.Parallel()
	store := filepath.Join(t.TempDir(), "records.db")
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n == 1 {
			<-r.Context().Done() // the first attempt never finishes: its proxy dies
			return
		}
		writeJSON(w, http.StatusCreated, map[string]int{"n": n})
	})
	// A 2 s lease leaves a wide margin for the first retry to find the
	// record still in flight.
	a := startProxy(t, "A", "--store", store, "--upstream", up.URL, "--lease", "2s")
	b := startProxy(t, "B", "--store", store, "--upstream", up.URL, "--lease", "2s")
	key := newKey(t)
	errc := make(chan error, 1)
	go func() {
		_, err := trySend(http.MethodPost, a.url+"/payments", `{"amount":9}`, idem.HeaderKey, key)
		errc <- err
	}()
	up.waitHit(t)
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.done
	if err := <-errc; err == nil {
		t.Fatal("the client of the killed proxy got an answer")
	}
	killed := time.Now()
	if r := send(t, http.MethodPost, b.url+"/payments", `{"amount":9}`, idem.HeaderKey, key); r.status != http.StatusConflict {
		t.Fatalf("retry right after the crash: %v", r)
	}
	// The lease has to pass.
	r := postWhileInProgress(t, b.url+"/payments", `{"amount":9}`, key, 15*time.Second, 100*time.Millisecond)
	if r.status != http.StatusCreated || r.header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("retry after the lease: %v", r)
	}
	t.Logf("the retry ran %v after the crash", time.Since(killed).Round(10*time.Millisecond))
	if c := up.count(key); c != 2 {
		t.Fatalf("the upstream ran %d times, want 2 (the crashed attempt and the retry)", c)
	}
	if again := send(t, http.MethodPost, b.url+"/payments", `{"amount":9}`, idem.HeaderKey, key); again.header.Get(idem.HeaderReplayed) != "true" || again.body != r.body {
		t.Fatalf("later retry: %v", again)
	}
}

// TestProcessGracefulShutdown: SIGTERM while a request is at the upstream
// stops accepting, lets the request finish and store its record, and
// exits 0; a retry through a new process replays.
func TestProcessGracefulShutdown(t *testing.T) {
	t.Parallel()
	store := filepath.Join(t.TempDir(), "records.db")
	g := newGate(t)
	up := newUpstream(t, g.held)
	a := startProxy(t, "A", "--store", store, "--upstream", up.URL)
	key := newKey(t)
	res := make(chan reply, 1)
	go func() {
		r, err := trySend(http.MethodPost, a.url+"/payments", `{"amount":3}`, idem.HeaderKey, key)
		if err != nil {
			r = reply{status: -1, body: err.Error()}
		}
		res <- r
	}()
	up.waitHit(t)
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	a.waitLog(t, "shutting down")
	g.open()
	first := <-res
	if first.status != http.StatusCreated || first.header.Get(idem.HeaderReplayed) != "false" {
		t.Fatalf("the in-flight request got %v", first)
	}
	if code := a.wait(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM", code)
	}
	a.waitLog(t, `"msg":"stopped"`)
	b := startProxy(t, "B", "--store", store, "--upstream", up.URL)
	r := send(t, http.MethodPost, b.url+"/payments", `{"amount":3}`, idem.HeaderKey, key)
	if r.status != http.StatusCreated || r.header.Get(idem.HeaderReplayed) != "true" || r.body != first.body {
		t.Fatalf("retry after the restart: %v", r)
	}
	if c := up.count(key); c != 1 {
		t.Fatalf("the upstream ran %d times", c)
	}
}

// TestProcessAdminEndpoints: /healthz and /metrics are answered by the
// proxy on its own address, or only on --admin-addr when it is given (then
// /healthz on the main address is forwarded). Flags come from IDEM_*
// variables here.
func TestProcessAdminEndpoints(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, nil)
	store := filepath.Join(t.TempDir(), "records.db")
	p := startProxy(t, "A", "--store", store, "--upstream", up.URL)
	if h := send(t, http.MethodGet, p.url+"/healthz", ""); h.status != 200 || !strings.Contains(h.body, `"ok"`) {
		t.Fatalf("healthz: %v", h)
	}
	send(t, http.MethodPost, p.url+"/payments", `{}`, idem.HeaderKey, newKey(t))
	m := send(t, http.MethodGet, p.url+"/metrics", "")
	if m.status != 200 || !strings.Contains(m.body, "idem_executions_total 1") {
		t.Fatalf("metrics: %d\n%s", m.status, m.body)
	}
	if n := up.total(); n != 1 {
		t.Fatalf("admin requests reached the upstream: %d requests", n)
	}

	q := runIdem(t, "B", []string{"IDEM_UPSTREAM=" + up.URL, "IDEM_STORE=" + store, "IDEM_ADDR=127.0.0.1:0",
		"IDEM_ADMIN_ADDR=127.0.0.1:0", "IDEM_LOG_FORMAT=json"}, "proxy")
	var start struct {
		Addr      string
		AdminAddr string `json:"admin_addr"`
	}
	line := q.waitLog(t, `"msg":"idem proxy listening"`)
	if err := json.Unmarshal([]byte(line), &start); err != nil || start.AdminAddr == "" {
		t.Fatalf("start line %q: %v", line, err)
	}
	if h := send(t, http.MethodGet, "http://"+start.AdminAddr+"/healthz", ""); h.status != 200 {
		t.Fatalf("admin healthz: %v", h)
	}
	if h := send(t, http.MethodGet, "http://"+start.Addr+"/healthz", ""); h.status != http.StatusCreated || up.total() != 2 {
		t.Fatalf("/healthz on the main address should be forwarded: %v", h)
	}
}

const goodConfig = `# per-route rules
version: 1
routes:
  "POST /payments":
    key: required
    ttl: 48h
    release_statuses: [409]
  "/orders/{id}/refund":
    scope_header: X-Api-Key
    wait: 2s
    max_request_body: 64KiB
`

const badConfig = `routes:
  "POST /payments":
    key: maybe
    colour: blue
  "/orders/{id}":
    lease: 10
    store_statuses: [502]
`

// TestProcessCheckConfig runs --check-config on good and bad files, and
// checks that the proxy refuses to start with the bad one, giving the same
// messages.
func TestProcessCheckConfig(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte(goodConfig), 0o644)
	os.WriteFile(bad, []byte(badConfig), 0o644)

	out, err := exec.Command(idemBinary(t), "proxy", "--check-config", good).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ok, 2 route(s)") {
		t.Fatalf("good file: %v\n%s", err, out)
	}

	cmd := exec.Command(idemBinary(t), "proxy", "--check-config", bad)
	cmd.Env = childEnv()
	out, err = cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); err == nil || code != 1 {
		t.Fatalf("bad file: exit %d\n%s", code, out)
	}
	want := []string{
		bad + `:3:10: route "POST /payments": key: "maybe" is not one of`,
		bad + `:4:5: route "POST /payments": unknown field "colour"`,
		bad + `:6:12: route "/orders/{id}": lease: "10" is not a duration`,
		bad + `:7:22: route "/orders/{id}": store_statuses: 502 cannot be stored`,
	}
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Errorf("missing %q in:\n%s", w, out)
		}
	}

	p := runIdem(t, "refused", nil, "proxy", "--addr", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1",
		"--store", filepath.Join(dir, "r.db"), "--config", bad)
	if code := p.wait(t); code == 0 {
		t.Fatal("the proxy started with an invalid file")
	}
	for _, w := range want {
		if !strings.Contains(p.logs.String(), w) {
			t.Errorf("start-up refusal lacks %q:\n%s", w, p.logs)
		}
	}
	if strings.Contains(p.logs.String(), "listening") {
		t.Error("the proxy listened with an invalid file")
	}
}
