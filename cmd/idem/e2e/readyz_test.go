package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// readyzBound is how long a /readyz answer may take with a dependency
// frozen: the probe's second, its slack, and room for a loaded machine
// and -race binaries. Without the probe's own bound the answer waits as
// long as the client does.
const readyzBound = 3 * time.Second

// readyz is a /readyz answer.
type readyz struct {
	code   int
	Status string `json:"status"`
	Checks map[string]struct {
		Status, Kind, Error string
		DurationMs          int64
	} `json:"checks"`
	raw  string
	took time.Duration
}

func (r readyz) String() string {
	return fmt.Sprintf("%d after %v: %s", r.code, r.took.Round(time.Millisecond), r.raw)
}

// getReadyz asks base (http://host:port) for /readyz.
func getReadyz(base string) (readyz, error) {
	began := time.Now()
	resp, err := httpClient.Get(base + "/readyz")
	if err != nil {
		return readyz{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return readyz{}, err
	}
	r := readyz{code: resp.StatusCode, raw: strings.TrimSpace(string(raw)), took: time.Since(began)}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		return r, fmt.Errorf("/readyz Content-Type %q", ct)
	}
	return r, json.Unmarshal(raw, &r)
}

// checkReadyzCycle checks a service's /readyz through a dependency's
// forwarder: 200 naming check (of kind) ok; with the forwarder frozen,
// 503 naming it down within readyzBound, for concurrent and sequential
// polls, which open no pile of connections; 200 again once it thaws.
func checkReadyzCycle(t *testing.T, base string, fwd *tcpProxy, check, kind string) {
	t.Helper()
	var up readyz
	eventually(t, 30*time.Second, 50*time.Millisecond, "/readyz answers 200", func() (bool, error) {
		var err error
		up, err = getReadyz(base)
		return err == nil && up.code == http.StatusOK, err
	})
	if c := up.Checks[check]; up.Status != "ready" || c.Status != "ok" || c.Kind != kind {
		t.Fatalf("/readyz with everything up: %v", up)
	}

	fwd.freeze()
	accepted := fwd.acceptedCount()
	const concurrent = 20
	answers := make([]readyz, concurrent)
	errs := make([]error, concurrent)
	var wg sync.WaitGroup
	for i := range concurrent {
		wg.Go(func() { answers[i], errs[i] = getReadyz(base) })
	}
	wg.Wait()
	for range 3 {
		a, err := getReadyz(base)
		answers, errs = append(answers, a), append(errs, err)
	}
	for i, a := range answers {
		if errs[i] != nil {
			t.Fatalf("/readyz %d with %s frozen: %v", i, check, errs[i])
		}
		c := a.Checks[check]
		if a.code != http.StatusServiceUnavailable || a.Status != "unavailable" || c.Status != "down" || c.Kind != kind || c.Error == "" {
			t.Fatalf("/readyz %d with %s frozen: %v", i, check, a)
		}
		if a.took > readyzBound {
			t.Errorf("/readyz %d with %s frozen took %v, want at most %v", i, check, a.took, readyzBound)
		}
	}
	t.Logf("frozen %s: %v", check, answers[0])
	// Concurrent polls share one probe: a handful of probes in all, each
	// with at most one new connection (a pool's reconnect).
	n := fwd.acceptedCount() - accepted
	if n > 8 {
		t.Errorf("%d polls opened %d connections to the frozen %s, want a handful", len(answers), n, check)
	}
	t.Logf("%d polls opened %d connections to the frozen %s", len(answers), n, check)

	fwd.unfreeze()
	eventually(t, 30*time.Second, 50*time.Millisecond, "/readyz answers 200 after the thaw", func() (bool, error) {
		a, err := getReadyz(base)
		return err == nil && a.code == http.StatusOK && a.Checks[check].Status == "ok", err
	})
}

// idem serve on PostgreSQL: /readyz follows the database.
func TestReadyzServePostgres(t *testing.T) {
	t.Parallel()
	db := newPGDatabase(t)
	fwd := newTCPProxy(t, pgHostPort(t, db.url))
	s := startServer(t, "pg-ready", "--db", viaHost(t, db.url, fwd.addr()), "--access-log=false")
	checkReadyzCycle(t, s.url, fwd, "store", "postgres")
	// /healthz stays what it was: the process answers, and its store.
	if h := get(t, s, "/healthz"); h.status != http.StatusOK {
		t.Errorf("/healthz: %v", h)
	}
}

// idem proxy on Redis: /readyz follows the store, on the proxy's own
// address (never forwarded) and on --admin-addr.
func TestReadyzProxyRedis(t *testing.T) {
	t.Parallel()
	r := newRedisPrefix(t)
	fwd := newTCPProxy(t, r.addr())
	var forwarded atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		forwarded.Add(1)
		w.WriteHeader(http.StatusTeapot)
	}))
	t.Cleanup(up.Close)
	p := startCommand(t, "proxy-ready", "proxy", "--upstream", up.URL, "--store", r.storeURL(fwd.addr()), "--access-log=false")
	checkReadyzCycle(t, p.url, fwd, "store", "redis")
	if n := forwarded.Load(); n != 0 {
		t.Errorf("%d /readyz requests reached the upstream", n)
	}

	admin := freeAddr(t)
	pa := startCommand(t, "proxy-admin", "proxy", "--upstream", up.URL, "--store", r.storeURL(""), "--admin-addr", admin)
	if a, err := getReadyz("http://" + admin); err != nil || a.code != http.StatusOK {
		t.Errorf("/readyz on --admin-addr: %v %v", a, err)
	}
	// With --admin-addr, /readyz on the proxy's address is the upstream's.
	resp, err := httpClient.Get(pa.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	if resp.StatusCode != http.StatusTeapot || forwarded.Load() != 1 {
		t.Errorf("/readyz on the proxy's address with --admin-addr: %d, forwarded %d", resp.StatusCode, forwarded.Load())
	}
}

// idem consume: /readyz follows the broker.
func TestReadyzConsumeNATS(t *testing.T) {
	t.Parallel()
	nf := newNATS(t)
	fwd := newTCPProxy(t, nf.HostPort(t))
	c := startCommand(t, "consume-ready", "consume", "--db", t.TempDir()+"/ledger.db", "--events", nf.URLVia(fwd.addr()), "--events-subject", nf.Subject())
	checkReadyzCycle(t, c.url, fwd, "broker", "nats")
	if a, err := getReadyz(c.url); err != nil || a.Checks["store"].Status != "ok" || a.Checks["store"].Kind != "sqlite" {
		t.Errorf("the ledger's check: %v %v", a, err)
	}
}

// idem serve --events: /readyz follows the broker too (RabbitMQ here).
func TestReadyzServeEventsAMQP(t *testing.T) {
	t.Parallel()
	af := newAMQP(t)
	fwd := newTCPProxy(t, af.HostPort(t))
	s := startServer(t, "amqp-ready", "--db", t.TempDir()+"/serve.db", "--events", af.URLVia(fwd.addr()), "--events-subject", af.Subject(), "--access-log=false")
	checkReadyzCycle(t, s.url, fwd, "broker", "amqp")
}

// An --events broker that cannot be reached at start is named in the
// start-up log with its URL (password hidden) and the connection error;
// serve starts anyway and /readyz names the broker.
func TestServeEventsBrokerUnreachableAtStart(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ scheme, kind string }{{"nats", "nats"}, {"amqp", "amqp"}} {
		t.Run(tc.kind, func(t *testing.T) {
			t.Parallel()
			hp := freeAddr(t) // nothing listens there
			brokerURL := tc.scheme + "://guest:hunter2-secret@" + hp + "/"
			s := startServer(t, "unreachable-"+tc.kind, "--db", t.TempDir()+"/serve.db", "--events", brokerURL)
			var line string
			for _, l := range strings.Split(s.log.tail(20), "\n") {
				if strings.Contains(l, "the broker does not answer") {
					line = l
				}
			}
			for _, want := range []string{`"level":"WARN"`, "guest:xxxxx@" + hp} {
				if !strings.Contains(line, want) {
					t.Errorf("the start-up warning lacks %q: %q\nlog:\n%s", want, line, s.log.tail(20))
				}
			}
			// The dial's own error: refused, or, when the machine is so loaded
			// that the start-up dial's deadline passes first, its timeout.
			if !strings.Contains(line, "connection refused") && !strings.Contains(line, "dial tcp "+hp+": i/o timeout") {
				t.Errorf("the start-up warning lacks the dial's error: %q\nlog:\n%s", line, s.log.tail(20))
			}
			a, err := getReadyz(s.url)
			if err != nil || a.code != http.StatusServiceUnavailable || a.Checks["broker"].Status != "down" ||
				a.Checks["broker"].Kind != tc.kind || !strings.Contains(a.Checks["broker"].Error, "connection refused") || a.Checks["store"].Status != "ok" {
				t.Errorf("/readyz: %v %v", a, err)
			}
			if s.log.contains("hunter2-secret") || strings.Contains(a.raw, "hunter2-secret") {
				t.Error("the broker's password was logged or answered")
			}
		})
	}
}
