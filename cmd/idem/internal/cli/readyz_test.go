package cli

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// readyAnswer is a /readyz answer as a client reads it.
type readyAnswer struct {
	status int
	header http.Header
	body   readyBody
	raw    string
	took   time.Duration
}

func getReady(t *testing.T, url string) readyAnswer {
	t.Helper()
	began := time.Now()
	resp, err := http.Get(url)
	if err != nil {
		t.Error(err)
		return readyAnswer{}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := readyAnswer{status: resp.StatusCode, header: resp.Header, raw: string(raw), took: time.Since(began)}
	if err := json.Unmarshal(raw, &a.body); err != nil {
		t.Errorf("/readyz body %q: %v", raw, err)
	}
	return a
}

// readyBound is how long a /readyz answer may take in these tests: the
// probe's second, its slack, and room for a loaded machine.
const readyBound = 3 * time.Second

// The body names every check with its status and kind; 200 "ready" when
// all answer, 503 "unavailable" naming the one that failed and why.
func TestReadyzBody(t *testing.T) {
	t.Parallel()
	var brokerErr atomic.Pointer[error]
	broker := &readyCheck{name: "broker", kind: "nats", probe: func(context.Context) error {
		if p := brokerErr.Load(); p != nil {
			return *p
		}
		return nil
	}}
	store := &readyCheck{name: "store", kind: "postgres", probe: func(context.Context) error { return nil }}
	srv := httptest.NewServer(newReadiness(slog.New(slog.DiscardHandler), nil, store, broker))
	t.Cleanup(srv.Close)

	a := getReady(t, srv.URL)
	if a.status != http.StatusOK || a.body.Status != "ready" || a.header.Get("Content-Type") != "application/json" || a.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("all up: %d %s %v", a.status, a.raw, a.header)
	}
	for name, kind := range map[string]string{"store": "postgres", "broker": "nats"} {
		if c := a.body.Checks[name]; c.Status != "ok" || c.Kind != kind || c.Error != "" {
			t.Errorf("check %s: %+v", name, c)
		}
	}
	if strings.Contains(a.raw, `"error"`) {
		t.Errorf("an ok answer carries an error field: %s", a.raw)
	}

	down := errors.New("not connected (reconnecting); last connection attempt: dial tcp 127.0.0.1:4222: connect: connection refused")
	brokerErr.Store(&down)
	a = getReady(t, srv.URL)
	if a.status != http.StatusServiceUnavailable || a.body.Status != "unavailable" {
		t.Fatalf("broker down: %d %s", a.status, a.raw)
	}
	if c := a.body.Checks["broker"]; c.Status != "down" || c.Error != down.Error() {
		t.Errorf("broker check: %+v", c)
	}
	if c := a.body.Checks["store"]; c.Status != "ok" {
		t.Errorf("store check: %+v", c)
	}
}

// A probe that stalls (and even ignores its deadline) makes the answer
// come within about a second, naming the check; frequent polling meanwhile
// starts no second probe of it (no pile-up of goroutines or connections),
// and the other checks still run, concurrently.
func TestReadyzStalledProbe(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var calls atomic.Int32
	// The broker's probe, which runs first, answers only once the
	// store's has started: if the probes ran one after the other, it
	// would fail.
	storeStarted := make(chan struct{})
	var once sync.Once
	stalled := &readyCheck{name: "store", kind: "postgres", probe: func(context.Context) error {
		calls.Add(1)
		once.Do(func() { close(storeStarted) })
		<-release // ignores its context, as a driver stuck in a syscall would
		return nil
	}}
	broker := &readyCheck{name: "broker", kind: "amqp", probe: func(ctx context.Context) error {
		select {
		case <-storeStarted:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	srv := httptest.NewServer(newReadiness(slog.New(slog.DiscardHandler), nil, broker, stalled))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) })

	var wg sync.WaitGroup
	answers := make([]readyAnswer, 40)
	for i := range answers {
		wg.Go(func() { answers[i] = getReady(t, srv.URL) })
	}
	wg.Wait()
	for range 5 { // and sequential polls while the probe is stuck
		answers = append(answers, getReady(t, srv.URL))
	}
	for i, a := range answers {
		if a.status != http.StatusServiceUnavailable || a.body.Checks["store"].Status != "down" ||
			!strings.Contains(a.body.Checks["store"].Error, "no answer within 1s") {
			t.Fatalf("answer %d: %d %s", i, a.status, a.raw)
		}
		if a.body.Checks["broker"].Status != "ok" {
			t.Fatalf("answer %d: the broker's probe did not run alongside the store's: %s", i, a.raw)
		}
		if a.took > readyBound {
			t.Errorf("answer %d took %v, want at most %v", i, a.took, readyBound)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the stalled probe was started %d times by %d polls, want once", n, len(answers))
	}
}

// A probe that honours its deadline is given one second.
func TestReadyzProbeDeadline(t *testing.T) {
	t.Parallel()
	var left atomic.Int64
	c := &readyCheck{name: "store", kind: "redis", probe: func(ctx context.Context) error {
		d, _ := ctx.Deadline()
		left.Store(int64(time.Until(d)))
		<-ctx.Done()
		return ctx.Err()
	}}
	srv := httptest.NewServer(newReadiness(slog.New(slog.DiscardHandler), nil, c))
	t.Cleanup(srv.Close)
	a := getReady(t, srv.URL)
	if got := time.Duration(left.Load()); got <= 0 || got > readyTimeout {
		t.Errorf("the probe's deadline was %v away, want at most %v", got, readyTimeout)
	}
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body.Checks["store"].Error, "no answer within 1s") || a.took > readyBound {
		t.Errorf("%d after %v: %s", a.status, a.took, a.raw)
	}
}

// No password of the dependencies' URLs reaches the body, even where a
// driver's error quotes the URL.
func TestReadyzRedactsPasswords(t *testing.T) {
	t.Parallel()
	specs := []string{"amqp://guest:s3cr%40t-pw@10.0.0.5:5672/", "redis+cluster://app:cluster-pw@h1:7000,h2:7001", "postgres://u:pg-pw@db/x"}
	c := &readyCheck{name: "broker", kind: "amqp", probe: func(context.Context) error {
		return errors.New(`dial amqp://guest:s3cr@t-pw@10.0.0.5:5672/: refused; also cluster-pw, pg-pw and nats://other:unknown-pw@x:4222`)
	}}
	srv := httptest.NewServer(newReadiness(slog.New(slog.DiscardHandler), specs, c))
	t.Cleanup(srv.Close)
	a := getReady(t, srv.URL)
	for _, secret := range []string{"s3cr@t-pw", "s3cr%40t-pw", "cluster-pw", "pg-pw", "unknown-pw"} {
		if strings.Contains(a.raw, secret) {
			t.Errorf("the body holds %q: %s", secret, a.raw)
		}
	}
	if !strings.Contains(a.raw, "refused") {
		t.Errorf("the error was dropped: %s", a.raw)
	}
}

// The readiness changes are logged (a load balancer polls too often for a
// line per answer): not ready once, ready again once.
func TestReadyzLogsChanges(t *testing.T) {
	t.Parallel()
	var up atomic.Bool
	c := &readyCheck{name: "store", kind: "sqlite", probe: func(context.Context) error {
		if up.Load() {
			return nil
		}
		return errors.New("disk I/O error")
	}}
	var logs syncBuffer
	srv := httptest.NewServer(newReadiness(slog.New(slog.NewJSONHandler(&logs, nil)), nil, c))
	t.Cleanup(srv.Close)
	for range 3 {
		getReady(t, srv.URL)
	}
	up.Store(true)
	for range 3 {
		getReady(t, srv.URL)
	}
	out := logs.String()
	if n := strings.Count(out, "not ready"); n != 1 || !strings.Contains(out, "disk I/O error") {
		t.Errorf("%d 'not ready' lines, want 1 naming the error:\n%s", n, out)
	}
	if n := strings.Count(out, "ready again"); n != 1 {
		t.Errorf("%d 'ready again' lines, want 1:\n%s", n, out)
	}
}

func TestURLPasswords(t *testing.T) {
	t.Parallel()
	for spec, want := range map[string]string{
		"postgres://u:pw@h/db":              "pw",
		"postgres://u@h/db":                 "",
		"redis://:only@h:6379/0":            "only",
		"rediss+cluster://u:p%2Fq@h1,h2":    "p%2Fq p/q",
		"amqp://guest:guest@h:5672/":        "guest",
		"idem.db":                           "",
		"nats://h:4222":                     "",
		"postgres://u:a@b@h/db":             "a@b",
		"postgres://h/db?password=inquery":  "",
		"memory":                            "",
		"postgres://u:pw@h/db?x=http://a@b": "pw",
	} {
		if got := strings.Join(urlPasswords(spec), " "); got != want {
			t.Errorf("urlPasswords(%q) = %q, want %q", spec, got, want)
		}
	}
}

// FuzzReadyRedact: a URL's password never survives in a /readyz error,
// whatever surrounds it.
func FuzzReadyRedact(f *testing.F) {
	f.Add("guest", "dial ", ": refused")
	f.Add("p@ss/word", "", "")
	f.Add("a:b", "x://y:", "@z")
	f.Fuzz(func(t *testing.T, pw, before, after string) {
		if len(pw) < 4 || strings.ContainsAny(pw, "@/?#\x00") {
			return // not a password a URL's user information carries
		}
		spec := "amqp://guest:" + pw + "@h:5672/"
		rd := newReadiness(slog.New(slog.DiscardHandler), []string{spec})
		if got := rd.clean(before + spec + after); strings.Contains(got, ":"+pw+"@") {
			t.Errorf("clean kept the password: %q", got)
		}
	})
}
