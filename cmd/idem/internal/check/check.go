// Package check grades an HTTP endpoint that claims to implement the
// Idempotency-Key pattern (draft-ietf-httpapi-idempotency-key-header), over
// real HTTP, from the outside: it is the engine of `idem check URL`.
//
// Run sends the endpoint a series of requests, each check with its own
// fresh random key, and reports every check as PASS, FAIL, WARN or SKIP with
// a one-line reason. A FAIL means the endpoint can execute an operation
// twice, answer one request with another's response, or accept requests it
// should refuse; a WARN is a departure from the draft or from good practice
// that does not by itself duplicate work.
//
// The checks execute the operation for real: seven times on an endpoint
// that deduplicates correctly, more on one that does not (up to all the
// concurrent duplicates). Point it at a test environment, with a payload
// whose side effects are harmless there.
package check

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults of Options.
const (
	DefaultMethod      = http.MethodPost
	DefaultConcurrency = 20
	DefaultTimeout     = 10 * time.Second
	// MaxConcurrency bounds Options.Concurrency.
	MaxConcurrency = 1000
	// maxBody bounds each response body read; a longer body is compared by
	// its first maxBody bytes.
	maxBody = 1 << 20
)

// Options say what to check and how.
type Options struct {
	// URL is the endpoint: http or https. Required.
	URL string
	// Method is the request method. Defaults to POST.
	Method string
	// Body is the request payload sent by every check. When it is a JSON
	// object, the JSON check (reordered members) runs and the variant can
	// be derived; Content-Type defaults to application/json when it is
	// valid JSON. Defaults to no body.
	Body []byte
	// Variant is a payload different from Body, sent with a used key to
	// check that the endpoint refuses it (422). Defaults to Body with its
	// first number, boolean or string member changed (or a member added),
	// when Body is a JSON object.
	Variant []byte
	// Headers are sent with every request: credentials, Content-Type.
	// Defaults to none.
	Headers http.Header
	// SecondTenantHeaders, when set, replace the fields of the same names in
	// Headers to make requests as a second tenant (for example another
	// Authorization), for the tenant isolation check. Defaults to none: the
	// check is skipped.
	SecondTenantHeaders http.Header
	// Concurrency is the number of simultaneous duplicates sent by the
	// concurrency check. Defaults to 20; at most MaxConcurrency.
	Concurrency int
	// Timeout bounds each request. Defaults to 10 seconds.
	Timeout time.Duration
	// CountURL, when set, is a URL answering GET with {"count":N}: the
	// number of times the operation has run (the payments demo's
	// /api/payments/count). Each check then also verifies executions, not
	// only responses: the count must grow by exactly the number of new
	// keys the check got a success for (one per check that sends a new
	// key, two for the tenant check), and by zero for replays and refused
	// requests; any other growth is a FAIL. The count must be this run's
	// alone: nothing else may run the operation meanwhile. Defaults to
	// none: executions are inferred from responses.
	CountURL string
	// Client sends the requests. Its redirects should not be followed,
	// since a redirect is a response to compare like any other. Its
	// transport's TLS configuration, if it is an *http.Transport, is also
	// used for the few requests written by hand. Defaults to a client of
	// its own that follows no redirects.
	Client *http.Client
}

// Status is the grade of a check.
type Status string

// The grades.
const (
	Pass Status = "PASS"
	Fail Status = "FAIL"
	Warn Status = "WARN"
	Skip Status = "SKIP"
)

// Check is the outcome of one check.
type Check struct {
	// Name identifies the check (for example "payload-mismatch").
	Name string `json:"name"`
	// Status is the grade.
	Status Status `json:"status"`
	// Reason says why, in one line.
	Reason string `json:"reason"`
	// Details are the observations behind the grade, one per line.
	Details []string `json:"details,omitempty"`
}

// Report is the outcome of Run.
type Report struct {
	Method string  `json:"method"`
	URL    string  `json:"url"`
	Checks []Check `json:"checks"`
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool {
	for _, c := range r.Checks {
		if c.Status == Fail {
			return true
		}
	}
	return false
}

// Count returns how many checks have status s.
func (r *Report) Count(s Status) int {
	n := 0
	for _, c := range r.Checks {
		if c.Status == s {
			n++
		}
	}
	return n
}

// Check returns the check called name, and false if there is none.
func (r *Report) Check(name string) (Check, bool) {
	for _, c := range r.Checks {
		if c.Name == name {
			return c, true
		}
	}
	return Check{}, false
}

// WriteText writes the report for people: one line per check, the details
// of the checks that did not pass, and a summary line. Write errors are the
// writer's to report (an *os.File's next Write, a bufio.Writer's Flush).
func (r *Report) WriteText(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "idem check %s %s\n\n", r.Method, r.URL)
	width := 0
	for _, c := range r.Checks {
		width = max(width, len(c.Name))
	}
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "%-4s  %-*s  %s\n", c.Status, width, c.Name, c.Reason)
		if c.Status == Fail || c.Status == Warn {
			for _, d := range c.Details {
				fmt.Fprintf(&b, "      %*s  - %s\n", width, "", d)
			}
		}
	}
	verdict := "PASS"
	if r.Failed() {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "\n%s: %d passed, %d failed, %d warnings, %d skipped\n",
		verdict, r.Count(Pass), r.Count(Fail), r.Count(Warn), r.Count(Skip))
	_, _ = io.WriteString(w, b.String())
}

// WriteJSON writes the report as one indented JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("check: writing the JSON report: %w", err)
	}
	return nil
}

// Run checks the endpoint o.URL. It returns an error, and no report, for
// invalid options and when the endpoint cannot be reached at all; an
// endpoint that answers is graded, whatever it answers. If ctx ends during
// the run, Run returns the checks completed so far with ctx's error.
func Run(ctx context.Context, o Options) (*Report, error) {
	r, err := newRunner(o)
	if err != nil {
		return nil, err
	}
	defer r.close()
	rep := &Report{Method: r.o.Method, URL: r.o.URL}

	before, err := r.count(ctx)
	if err != nil {
		return nil, fmt.Errorf("check: --count-url %s: %w", r.o.CountURL, err)
	}
	// The first check doubles as the reachability test.
	c, err := r.missingKey(ctx)
	if err != nil {
		return nil, fmt.Errorf("check: %s %s: %w", r.o.Method, r.o.URL, err)
	}
	c, before = r.verifyCount(ctx, c, before, 0)
	rep.Checks = append(rep.Checks, c)
	for _, f := range []func(context.Context) Check{
		r.malformedKeys, r.firstRequest, r.replay, r.keyForms, r.jsonForms,
		r.payloadMismatch, r.concurrentDuplicates, r.tenantIsolation,
	} {
		n := r.expectedExecutions()
		c := f(ctx)
		if err := ctx.Err(); err != nil {
			// c may blame the endpoint for the cancellation: leave it out.
			return rep, fmt.Errorf("check: %w", err)
		}
		c, before = r.verifyCount(ctx, c, before, r.expectedExecutions()-n)
		rep.Checks = append(rep.Checks, c)
	}
	rep.Checks = append(rep.Checks, r.problemDetails(), r.expiry())
	r.qualify(rep)
	return rep, nil
}

// runner holds one run's settings and what it has seen.
type runner struct {
	o      Options
	target *url.URL
	own    *http.Transport // the transport of a client Run made, closed at the end

	mu        sync.Mutex
	exchanges []*exchange // every response, for the checks that look at all of them
	// executions are the success bodies of first executions under
	// distinct keys: if two are equal, bodies cannot tell a replay from a
	// second execution.
	executions [][]byte
	markerSeen bool
	// expected counts the executions the checks caused as far as the
	// responses tell: one per new key answered with success.
	expected int

	first *exchange // the first request's successful response
	key3  string    // its key
}

func newRunner(o Options) (*runner, error) {
	if o.URL == "" {
		return nil, errors.New("check: no URL")
	}
	u, err := url.Parse(o.URL)
	if err != nil {
		return nil, fmt.Errorf("check: URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("check: URL scheme %q: only http and https are supported", u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("check: URL %q has no host", o.URL)
	}
	if o.Method == "" {
		o.Method = DefaultMethod
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Concurrency < 2 || o.Concurrency > MaxConcurrency {
		return nil, fmt.Errorf("check: Concurrency %d is not between 2 and %d", o.Concurrency, MaxConcurrency)
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Timeout < 0 {
		return nil, errors.New("check: Timeout is negative")
	}
	r := &runner{o: o, target: u}
	if o.Client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = o.Concurrency
		r.own = t
		r.o.Client = &http.Client{
			Transport:     t,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	return r, nil
}

func (r *runner) close() {
	if r.own != nil {
		r.own.CloseIdleConnections()
	}
}

// newKey returns a fresh random key, unique to this run and check.
func newKey() string {
	return "idem-check-" + strings.ToLower(rand.Text())
}

// quote returns key in the Structured Field string form; newKey's keys
// need no escaping.
func quote(key string) string { return `"` + key + `"` }

// exchange is one request and what came back.
type exchange struct {
	what   string // what the request was for, in details
	status int
	header http.Header
	body   []byte
	err    error
}

func (x *exchange) ok() bool { return x.err == nil && x.status >= 200 && x.status < 300 }

// same reports whether y answers exactly as x did: status and body.
func (x *exchange) same(y *exchange) bool {
	return x.err == nil && y.err == nil && x.status == y.status && bytes.Equal(x.body, y.body)
}

func (x *exchange) String() string { return x.what + ": " + x.outcome() }

// outcome describes the answer: status, body size, replay marker and
// Retry-After.
func (x *exchange) outcome() string {
	if x.err != nil {
		return "no response: " + x.err.Error()
	}
	s := fmt.Sprintf("%d %s, %d-byte body", x.status, http.StatusText(x.status), len(x.body))
	if name, v, ok := marker(x.header); ok {
		s += fmt.Sprintf(", %s: %s", name, v)
	}
	if ra := x.header.Get("Retry-After"); ra != "" {
		s += ", Retry-After: " + ra
	}
	return s
}

// markerHeaders are the response fields that servers use to say a response
// is a replay.
var markerHeaders = []string{"Idempotency-Replayed", "Idempotent-Replayed", "X-Idempotency-Replayed", "X-Idempotent-Replayed"}

// marker returns the replay marker of a response, if it has one.
func marker(h http.Header) (name, value string, ok bool) {
	for _, name := range markerHeaders {
		if v := h.Get(name); v != "" {
			return name, strings.ToLower(strings.TrimSpace(v)), true
		}
	}
	return "", "", false
}

// replayed reports whether a response's marker says it is a replay (yes),
// says it is not (no), or there is no marker.
func replayed(x *exchange) (yes, no bool) {
	_, v, ok := marker(x.header)
	return ok && v == "true", ok && v == "false"
}

// request describes a request to send.
type request struct {
	what string
	// keys are the Idempotency-Key field values; none sends no field.
	keys []string
	body []byte
	// tenant2 sends the second tenant's headers.
	tenant2 bool
	// raw writes the request by hand, so that the key's bytes reach the
	// server as they are (net/http refuses control characters).
	raw bool
	// serverLevel marks a request whose refusal may come from the HTTP
	// server rather than the endpoint: its answer is left out of the
	// problem-details check.
	serverLevel bool
}

// header returns the header fields of q, without the key.
func (r *runner) header(q request) http.Header {
	h := r.o.Headers.Clone()
	if h == nil {
		h = http.Header{}
	}
	if q.tenant2 {
		for k, vs := range r.o.SecondTenantHeaders {
			h[http.CanonicalHeaderKey(k)] = vs
		}
	}
	if h.Get("Content-Type") == "" && len(q.body) > 0 && json.Valid(q.body) {
		h.Set("Content-Type", "application/json")
	}
	return h
}

// send sends q once and records the exchange.
func (r *runner) send(ctx context.Context, q request) *exchange {
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	x := &exchange{what: q.what}
	if q.raw {
		x.status, x.header, x.body, x.err = r.sendRaw(ctx, q)
	} else {
		x.status, x.header, x.body, x.err = r.sendHTTP(ctx, q)
	}
	if x.err == nil {
		r.mu.Lock()
		if !q.serverLevel {
			r.exchanges = append(r.exchanges, x)
		}
		if _, _, ok := marker(x.header); ok {
			r.markerSeen = true
		}
		r.mu.Unlock()
	}
	return x
}

func (r *runner) sendHTTP(ctx context.Context, q request) (int, http.Header, []byte, error) {
	var body io.Reader
	if q.body != nil {
		body = bytes.NewReader(q.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.o.Method, r.o.URL, body)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header = r.header(q)
	if len(q.keys) > 0 {
		req.Header["Idempotency-Key"] = q.keys
	}
	resp, err := r.o.Client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return 0, nil, nil, fmt.Errorf("reading the response body: %w", err)
	}
	return resp.StatusCode, resp.Header, b, nil
}

// execute sends a request with a new key and, like a well-behaved client,
// retries it with the same key when the answer invites a retry (5xx, 429,
// 409 with Retry-After), up to three attempts in all. It returns every
// attempt; the last one is the outcome.
func (r *runner) execute(ctx context.Context, q request) []*exchange {
	var xs []*exchange
	for i := 0; ; i++ {
		x := r.send(ctx, q)
		xs = append(xs, x)
		if i == 2 || !retryable(x) || wait(ctx, x) != nil {
			break
		}
		q.what = fmt.Sprintf("retry %d", i+1)
	}
	return xs
}

// executeNew runs q, the first request under a new key (with execute's
// retries), and notes its success body; when it fails it returns false
// with c marked Skip, as the check then has nothing to compare with.
func (r *runner) executeNew(ctx context.Context, c *Check, q request) (xs []*exchange, first *exchange, ok bool) {
	xs = r.execute(ctx, q)
	first = xs[len(xs)-1]
	if !first.ok() {
		c.Status, c.Reason, c.Details = Skip, fmt.Sprintf("the request with a new key failed (%s)", statusOf(first)), describe(xs)
		return xs, first, false
	}
	r.executed(first)
	return xs, first, true
}

// executed notes the success body of a first execution under a new key.
func (r *runner) executed(x *exchange) {
	r.mu.Lock()
	r.executions = append(r.executions, x.body)
	r.expected++
	r.mu.Unlock()
}

func (r *runner) expectedExecutions() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.expected
}

// maxCountBody bounds the count endpoint's answer.
const maxCountBody = 64 << 10

// count reads the execution count at CountURL (0 without one).
func (r *runner) count(ctx context.Context) (int64, error) {
	if r.o.CountURL == "" {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, r.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.o.CountURL, nil)
	if err != nil {
		return 0, err
	}
	for k, vs := range r.o.Headers {
		if k != "Content-Type" {
			req.Header[k] = vs
		}
	}
	resp, err := r.o.Client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxCountBody))
	if err != nil {
		return 0, fmt.Errorf("reading the count: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET answered %d, want 200 with {\"count\":N}", resp.StatusCode)
	}
	var v struct {
		Count *json.Number `json:"count"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil || v.Count == nil {
		return 0, fmt.Errorf("the answer %.100q is not {\"count\":N}", b)
	}
	n, err := v.Count.Int64()
	if err != nil {
		return 0, fmt.Errorf("the count %s is not a whole number", *v.Count)
	}
	return n, nil
}

// verifyCount reads the count after check c, whose requests should have
// run the operation want times since the count was before, and turns c
// into a FAIL when the count grew otherwise. It returns the check and the
// count to compare the next check with. Without CountURL it returns c
// unchanged.
func (r *runner) verifyCount(ctx context.Context, c Check, before int64, want int) (Check, int64) {
	if r.o.CountURL == "" {
		return c, before
	}
	after, err := r.count(ctx)
	if err != nil {
		c.Details = append(c.Details, "was: "+string(c.Status)+" "+c.Reason)
		c.Status, c.Reason = Fail, "the execution count could not be read: "+err.Error()
		return c, before
	}
	grew := after - before
	if grew == int64(want) {
		if c.Status != Skip {
			c.Reason += fmt.Sprintf("; executions verified: the count grew by %d", grew)
		}
		return c, after
	}
	c.Details = append(c.Details, "was: "+string(c.Status)+" "+c.Reason)
	c.Status = Fail
	c.Reason = fmt.Sprintf("the operation ran %d time(s) during this check by the count at --count-url, but %s",
		grew, plural(want, "new key was answered with success", "new keys were answered with success"))
	if want == 0 {
		c.Reason = fmt.Sprintf("the operation ran %d time(s) during this check by the count at --count-url, for replays and refused requests that must not run it", grew)
	}
	return c, after
}

// bodiesAlike reports whether two executions under distinct keys returned
// the same body, so that a body cannot tell a replay from an execution.
func (r *runner) bodiesAlike() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	for _, b := range r.executions {
		if seen[string(b)] {
			return true
		}
		seen[string(b)] = true
	}
	return false
}

// settle sends a request with a used key, waiting out up to two "in
// progress" answers (409 with Retry-After), and returns every attempt.
func (r *runner) settle(ctx context.Context, q request) []*exchange {
	var xs []*exchange
	for i := 0; ; i++ {
		x := r.send(ctx, q)
		xs = append(xs, x)
		if i == 2 || x.err != nil || x.status != http.StatusConflict || x.header.Get("Retry-After") == "" || wait(ctx, x) != nil {
			return xs
		}
	}
}

func retryable(x *exchange) bool {
	switch {
	case x.err != nil:
		return false
	case x.status >= 500, x.status == http.StatusTooManyRequests:
		return true
	case x.status == http.StatusConflict:
		return x.header.Get("Retry-After") != ""
	}
	return false
}

// wait waits as x's Retry-After asks, between 100 ms and 1 s: long enough
// for a server to settle, short enough for a check.
func wait(ctx context.Context, x *exchange) error {
	d := 100 * time.Millisecond
	if s := x.header.Get("Retry-After"); s != "" {
		if secs, err := strconv.Atoi(strings.TrimSpace(s)); err == nil && secs > 0 {
			d = time.Second
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func describe(xs []*exchange) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.String()
	}
	return out
}

// qualify downgrades the checks that tell replays from executions by their
// bodies when the endpoint gives two executions the same body and marks no
// replays: their PASS proves less than it says.
func (r *runner) qualify(rep *Report) {
	if r.o.CountURL != "" || r.markerSeen || !r.bodiesAlike() {
		// Executions counted, or told apart by markers or bodies.
		return
	}
	for i, c := range rep.Checks {
		switch c.Name {
		case nameReplay, nameConcurrent, nameKeyForms, nameJSON:
			if c.Status == Pass {
				rep.Checks[i].Status = Warn
				rep.Checks[i].Reason = "inconclusive: distinct executions return identical bodies and no replay marker, so a second execution looks like a replay"
				rep.Checks[i].Details = append(c.Details, "would pass: "+c.Reason)
			}
		}
	}
}
