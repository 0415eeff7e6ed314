package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/cmd/idem/internal/events"
)

// readyTimeout bounds each readiness probe: a dependency that does not
// answer within it is down.
const readyTimeout = time.Second

// readySlack is how long past a probe's deadline /readyz waits for the
// probe to return (it notices its deadline on its own) before it reports
// the dependency down without the probe's error.
const readySlack = 150 * time.Millisecond

// maxReadyError bounds the error text of one check in the /readyz body.
const maxReadyError = 300

// readyCheck is one dependency /readyz probes.
type readyCheck struct {
	// name is the check's key in the body: "store", "database", "broker".
	name string
	// kind is the backend: postgres, sqlite, redis, redis-cluster,
	// memory, nats, amqp.
	kind string
	// probe returns nil when the dependency answered; it must return by
	// its context's deadline.
	probe func(ctx context.Context) error

	mu  sync.Mutex
	run *probeRun // the probe running now; nil when none
}

// probeRun is one run of a check's probe.
type probeRun struct {
	started time.Time
	done    chan struct{} // closed when the probe returned
	err     error         // set before done is closed
	took    time.Duration // likewise
}

// wait waits for the probe until its deadline (and readySlack) or ctx's
// end, and returns whether it returned, and its error. A probe that has
// returned is reported as such even when its deadline has passed too.
func (r *probeRun) wait(ctx context.Context) (bool, error) {
	select {
	case <-r.done:
		return true, r.err
	default:
	}
	timer := time.NewTimer(time.Until(r.started.Add(readyTimeout + readySlack)))
	defer timer.Stop()
	select {
	case <-r.done:
		return true, r.err
	case <-timer.C:
		return false, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// start returns the check's running probe, starting one if none runs.
// Requests that arrive while a probe runs share it, so that frequent
// polling never runs more than one probe per dependency at a time (nor
// holds more than the one connection it uses). A probe that outlives its
// deadline (one that ignores it) is found still running by later requests,
// which report the dependency down without starting another.
func (c *readyCheck) start() *probeRun {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run != nil {
		return c.run
	}
	r := &probeRun{started: time.Now(), done: make(chan struct{})}
	c.run = r
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
		r.err = c.probe(ctx)
		if r.err != nil && ctx.Err() != nil {
			r.err = fmt.Errorf("%w: %w", errNoAnswer, r.err)
		}
		cancel()
		r.took = time.Since(r.started)
		c.mu.Lock()
		c.run = nil
		c.mu.Unlock()
		close(r.done)
	}()
	return r
}

// readiness answers GET /readyz: 200 when every dependency answered its
// probe within readyTimeout, 503 otherwise, with a JSON body naming each
// check (see docs/operations.md#readiness):
//
//	{"status":"ready","checks":{"store":{"status":"ok","kind":"postgres","durationMs":2}}}
//	{"status":"unavailable","checks":{"broker":{"status":"down","kind":"nats","durationMs":1000,"error":"..."}, ...}}
//
// The probes run concurrently, so that the answer comes within about
// readyTimeout whatever stalls. Errors have URL passwords removed.
type readiness struct {
	checks  []*readyCheck
	secrets []string
	logger  *slog.Logger

	mu    sync.Mutex
	state string // the last answer's status, to log changes
}

// newReadiness returns the /readyz handler for checks. specs are the URLs
// the dependencies were opened with: their passwords never appear in an
// answer, even where a driver's error quotes its URL.
func newReadiness(logger *slog.Logger, specs []string, checks ...*readyCheck) *readiness {
	var secrets []string
	for _, s := range specs {
		secrets = append(secrets, urlPasswords(s)...)
	}
	return &readiness{checks: checks, secrets: secrets, logger: logger}
}

// readyResult is one check in the /readyz body.
type readyResult struct {
	Status     string `json:"status"` // ok or down
	Kind       string `json:"kind"`
	DurationMs int64  `json:"durationMs"`
	Error      string `json:"error,omitempty"`
}

// readyBody is the /readyz body.
type readyBody struct {
	Status string                 `json:"status"` // ready or unavailable
	Checks map[string]readyResult `json:"checks"`
}

func (rd *readiness) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	runs := make([]*probeRun, len(rd.checks))
	for i, c := range rd.checks {
		runs[i] = c.start()
	}
	body := readyBody{Status: "ready", Checks: make(map[string]readyResult, len(rd.checks))}
	for i, run := range runs {
		c := rd.checks[i]
		res := readyResult{Status: "ok", Kind: c.kind}
		ok, err := run.wait(r.Context())
		if r.Context().Err() != nil {
			return // the client left
		}
		if ok {
			res.DurationMs = run.took.Milliseconds()
		} else {
			res.DurationMs, err = time.Since(run.started).Milliseconds(), errNoAnswer
		}
		if err != nil {
			res.Status, res.Error = "down", rd.clean(err.Error())
			body.Status = "unavailable"
		}
		body.Checks[c.name] = res
	}
	rd.logChange(r.Context(), body)
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if body.Status != "ready" {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write(append(b, '\n'))
}

// errNoAnswer is a probe still running past its deadline.
var errNoAnswer = noAnswer{}

type noAnswer struct{}

func (noAnswer) Error() string { return "no answer within " + readyTimeout.String() }

// logChange logs when the readiness changes (and the first answer when it
// is not ready): a load balancer polls often, so each answer is not worth a
// line, but the moment a dependency goes down is.
func (rd *readiness) logChange(ctx context.Context, body readyBody) {
	rd.mu.Lock()
	prev := rd.state
	rd.state = body.Status
	rd.mu.Unlock()
	switch {
	case body.Status == prev, body.Status == "ready" && prev == "":
		return
	case body.Status == "ready":
		rd.logger.LogAttrs(ctx, slog.LevelInfo, "ready again: every dependency answers")
		return
	}
	var attrs []slog.Attr
	for _, name := range slices.Sorted(maps.Keys(body.Checks)) {
		if res := body.Checks[name]; res.Status != "ok" {
			attrs = append(attrs, slog.Group(name, slog.String("kind", res.Kind), slog.String("error", res.Error)))
		}
	}
	rd.logger.LogAttrs(ctx, slog.LevelWarn, "not ready: a dependency does not answer", attrs...)
}

// clean removes passwords from an error text and bounds its length.
func (rd *readiness) clean(s string) string {
	for _, p := range rd.secrets {
		s = strings.ReplaceAll(s, p, "xxxxx")
	}
	s = urlCredentials.ReplaceAllString(s, "$1:xxxxx@")
	if len(s) > maxReadyError {
		cut := maxReadyError
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}

// urlCredentials matches the user:password@ of a URL in a text.
var urlCredentials = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):[^@/\s]*@`)

// urlPasswords returns the password of a URL (as written and
// percent-decoded), or nothing. It reads the user information itself
// rather than with url.Parse, which refuses the host lists of
// redis+cluster:// URLs.
func urlPasswords(spec string) []string {
	_, rest, ok := strings.Cut(spec, "://")
	if !ok {
		return nil
	}
	authority, _, _ := strings.Cut(rest, "/")
	authority, _, _ = strings.Cut(authority, "?")
	at := strings.LastIndexByte(authority, '@')
	if at < 0 {
		return nil
	}
	_, pw, ok := strings.Cut(authority[:at], ":")
	if !ok || pw == "" {
		return nil
	}
	out := []string{pw}
	if dec, err := url.PathUnescape(pw); err == nil && dec != pw {
		out = append(out, dec)
	}
	return out
}

// storeChecks are the readiness checks of serve's stores: "store" for the
// records, and "database" for the payments when they live elsewhere.
func storeChecks(db, records *backend.Store) []*readyCheck {
	if db == records {
		return []*readyCheck{storeCheck("store", records)}
	}
	return []*readyCheck{storeCheck("database", db), storeCheck("store", records)}
}

// storeCheck is the readiness check of an opened store.
func storeCheck(name string, s *backend.Store) *readyCheck {
	return &readyCheck{name: name, kind: string(s.Kind), probe: s.Ready}
}

// brokerCheck is the readiness check of a broker connection.
func brokerCheck(conn *events.Conn, rawURL string) *readyCheck {
	kind, _ := events.BrokerOf(rawURL)
	return &readyCheck{name: "broker", kind: string(kind), probe: conn.Ping}
}

// brokerStartWait bounds the start-up check of the broker.
const brokerStartWait = 2 * time.Second

// logBrokerAtStart waits up to brokerStartWait for the broker to answer,
// and logs a warning naming its URL (without password) and the connection
// error if it does not: the service starts anyway and connects when the
// broker comes.
func logBrokerAtStart(ctx context.Context, logger *slog.Logger, conn *events.Conn, what string) {
	ctx, cancel := context.WithTimeout(ctx, brokerStartWait)
	defer cancel()
	if err := conn.WaitReady(ctx); err != nil {
		logger.Warn("events: the broker does not answer; "+what, "broker", conn.Where, "error", err)
	}
}
