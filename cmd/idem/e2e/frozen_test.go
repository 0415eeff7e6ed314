package e2e

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemhq/idem"
)

// Bounds of the frozen-store tests. A store that stops answering (its
// connections open, nothing coming back) must turn into a 503 within the
// store timeout, and SIGTERM must end the process within the shutdown
// timeout, whatever the store is doing. The bounds leave room for a loaded
// machine and -race binaries; without the fixes the waits are unbounded.
const (
	frozenAnswerBound = 20 * time.Second
	frozenExitBound   = 25 * time.Second // --shutdown-timeout 2s, the stores' closing bound, a -race exit
	openFailBound     = 45 * time.Second // start-up's own bound (15 s) and a -race start
)

// viaHost returns raw (a URL) with its host:port replaced by hostport.
func viaHost(t *testing.T, raw, hostport string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = hostport
	return u.String()
}

// pgHostPort returns the host:port of a PostgreSQL URL.
func pgHostPort(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "5432")
	}
	return u.Host
}

// checkFrozenStore pays once through s, freezes fwd (between s and its
// store), and checks that a new payment, and a replay of the first one,
// answer 503 idempotency.store_unavailable with Retry-After within
// frozenAnswerBound; then that SIGTERM, sent while a request waits on the
// frozen store, ends the process within frozenExitBound (no second signal).
func checkFrozenStore(t *testing.T, s *server, fwd *tcpProxy, hdr ...string) {
	t.Helper()
	key1, key2, key3 := "before-"+randomName(8), "frozen-"+randomName(8), "sigterm-"+randomName(8)
	body1, body2, body3 := paymentBody(100, "order-"+key1), paymentBody(200, "order-"+key2), paymentBody(300, "order-"+key3)
	if r := mustPay(t, s, key1, body1, hdr...); r.status != http.StatusCreated {
		t.Fatalf("payment with the store answering: %v", r)
	}

	fwd.freeze()
	client := &http.Client{Timeout: frozenAnswerBound + 10*time.Second}
	for _, c := range []struct{ key, body string }{{key2, body2}, {key1, body1}} {
		began := time.Now()
		r, err := pay(client, s, c.key, c.body, hdr...)
		took := time.Since(began)
		if err != nil {
			t.Fatalf("with the store frozen, after %v: %v", took.Round(time.Millisecond), err)
		}
		checkUnavailable(t, r)
		if took > frozenAnswerBound {
			t.Errorf("the 503 took %v with the store frozen, want at most %v", took.Round(time.Millisecond), frozenAnswerBound)
		}
		t.Logf("frozen store: %d %s after %v", r.status, r.problemCode(), took.Round(time.Millisecond))
	}
	// The core's log line about the failure and the access log name the
	// key by the same hash (idem.RedactKey of the parsed key; the client
	// sent its quoted form).
	hash := `"key":"` + idem.RedactKey(key2) + `"`
	var core, access bool
	for _, line := range strings.Split(s.log.tail(200), "\n") {
		if strings.Contains(line, hash) {
			core = core || strings.Contains(line, `"level":"ERROR"`) || strings.Contains(line, `"level":"WARN"`)
			access = access || strings.Contains(line, `"msg":"request"`)
		}
	}
	if !core || !access {
		t.Errorf("the key's hash %s in the core's log: %v, in the access log: %v; log:\n%s", idem.RedactKey(key2), core, access, s.log.tail(20))
	}

	// A request waiting on the frozen store while SIGTERM arrives.
	held := fwd.heldCount()
	go func() {
		c := &http.Client{Timeout: 2 * frozenExitBound}
		_, _ = pay(c, s, key3, body3, hdr...)
	}()
	fwd.waitHeld(t, held, frozenAnswerBound)
	s.killed = true // its exit status is the test's to check
	began := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	timer := time.NewTimer(frozenExitBound)
	defer timer.Stop()
	select {
	case <-s.exited:
		t.Logf("exited %v after SIGTERM (%v)", time.Since(began).Round(time.Millisecond), s.waitErr)
	case <-timer.C:
		t.Fatalf("still running %v after SIGTERM with the store frozen", frozenExitBound)
	}
}

// idem serve with payments and records in PostgreSQL, which stops
// answering.
func TestFrozenPostgresServe(t *testing.T) {
	t.Parallel()
	db := newPGDatabase(t)
	fwd := newTCPProxy(t, pgHostPort(t, db.url))
	s := startServer(t, "pg-frozen", "--db", viaHost(t, db.url, fwd.addr()), "--shutdown-timeout", "2s", "--store-timeout", "2s")
	checkFrozenStore(t, s, fwd)
}

// idem serve with records in Redis, which stops answering.
func TestFrozenRedisServe(t *testing.T) {
	t.Parallel()
	rp := newRedisPrefix(t)
	fwd := newTCPProxy(t, rp.addr())
	s := startServer(t, "redis-frozen", "--db", filepath.Join(t.TempDir(), "payments.db"),
		"--store", rp.storeURL(fwd.addr()), "--shutdown-timeout", "2s", "--store-timeout", "2s")
	checkFrozenStore(t, s, fwd)
}

// idem proxy with records in PostgreSQL, which stops answering.
func TestFrozenPostgresProxy(t *testing.T) {
	t.Parallel()
	db := newPGDatabase(t)
	fwd := newTCPProxy(t, pgHostPort(t, db.url))
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"pay_1"}`))
	}))
	t.Cleanup(up.Close)
	s := startCommand(t, "proxy-pg-frozen", "proxy", "--store", viaHost(t, db.url, fwd.addr()),
		"--upstream", up.URL, "--shutdown-timeout", "2s", "--store-timeout", "2s", "--cleanup-interval", "0")
	checkFrozenStore(t, s, fwd, "Authorization", "Bearer frozen")
}

// idem proxy with records in Redis, which stops answering.
func TestFrozenRedisProxy(t *testing.T) {
	t.Parallel()
	rp := newRedisPrefix(t)
	fwd := newTCPProxy(t, rp.addr())
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	s := startCommand(t, "proxy-redis-frozen", "proxy", "--store", rp.storeURL(fwd.addr()),
		"--upstream", up.URL, "--shutdown-timeout", "2s", "--store-timeout", "2s")
	checkFrozenStore(t, s, fwd, "Authorization", "Bearer frozen")
}

// Start-up against a server that accepts connections but never answers
// fails with a clear error and a non-zero status within a bound, for
// PostgreSQL (--db, and --store of the proxy) and Redis (--store).
func TestStartAgainstMuteServer(t *testing.T) {
	t.Parallel()
	mute := newTCPProxy(t, "127.0.0.1:1") // never dials: it is frozen
	mute.freeze()
	pg := "postgres://postgres@" + mute.addr() + "/x?sslmode=disable"
	sqlite := filepath.Join(t.TempDir(), "payments.db")
	for _, c := range []struct {
		name string
		args []string
	}{
		{"serve --db postgres", []string{"serve", "--addr", "127.0.0.1:0", "--db", pg}},
		{"serve --store redis", []string{"serve", "--addr", "127.0.0.1:0", "--db", sqlite, "--store", "redis://" + mute.addr() + "/0"}},
		{"proxy --store postgres", []string{"proxy", "--addr", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9", "--store", pg}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(binary(t), c.args...)
			killWithParent(cmd)
			cmd.WaitDelay = 5 * time.Second
			began := time.Now()
			done := make(chan struct{})
			var out []byte
			var err error
			go func() { out, err = cmd.CombinedOutput(); close(done) }()
			timer := time.NewTimer(openFailBound)
			defer timer.Stop()
			select {
			case <-done:
			case <-timer.C:
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("still starting after %v against a server that never answers; output:\n%s", openFailBound, out)
			}
			if err == nil || cmd.ProcessState.ExitCode() == 0 {
				t.Fatalf("exit %v, want a non-zero status; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), "cannot connect") || !strings.Contains(string(out), "no answer after") {
				t.Errorf("the error does not say the server did not answer:\n%s", out)
			}
			t.Logf("failed after %v: %s", time.Since(began).Round(time.Millisecond), strings.TrimSpace(string(out)))
		})
	}
}
