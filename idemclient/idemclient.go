// Package idemclient is the client half of the Idempotency-Key pattern: an
// http.RoundTripper that gives each unsafe request a key and retries it,
// with that same key, when the outcome is unknown or the server asks for a
// retry.
//
// A retry is safe only because the key lets the server recognise it: a
// request that was executed but whose response was lost (a timeout, a
// dropped connection) is answered from the server's record, not executed
// again. So the Transport never retries a request without a key, and never
// changes the key between attempts.
//
// What the Transport does with a request whose method is in Config.Methods:
//
//   - it sends a clone; the caller's *http.Request is never modified;
//   - without an Idempotency-Key field, it adds a fresh random key in the
//     Structured Field string form ("…"); a key the caller set is sent
//     exactly as the caller wrote it;
//   - it retries transport errors (see below), 409 Conflict with
//     Retry-After (the server is still running an earlier attempt), 429,
//     502, 503 and 504, waiting for Retry-After when the response carries
//     one and otherwise an exponential back-off with full jitter;
//   - it never retries 500, 400, 422 or any other status, nor 409 without
//     Retry-After (for example a key reused with another request);
//   - it never waits past the request context's deadline or
//     Config.MaxElapsed: when the next wait would end after either, it
//     returns the last response (or error) at once.
//
// Requests with other methods pass through to the base RoundTripper
// untouched, even when they carry a key: GET, PUT and DELETE are idempotent
// by definition, and their retry policy is the caller's.
//
// # Transport errors
//
// Every error from the base RoundTripper is retried, except when the
// caller's context is done, a TLS certificate was rejected, or the host
// name does not exist: those will not change on a retry. Errors that prove
// the request never left (connection refused) are retried too rather than
// told apart from the others: the key makes a retry harmless either way,
// and a refused connection is often a server that is restarting.
//
// A failure while reading a response body, after RoundTrip has returned, is
// not retried: the response belongs to the caller by then. Bound a single
// attempt with the base transport's ResponseHeaderTimeout (or
// http.Client.Timeout for the whole exchange).
//
// # Bodies
//
// A retry sends the body again. It comes from req.GetBody when set (as
// http.NewRequest sets it for bytes and strings readers); otherwise the
// Transport reads up to Config.MaxBufferedBody bytes into memory before the
// first attempt. A larger body is streamed once and never retried: a
// transport error is then returned wrapped with ErrBodyNotReplayable, and a
// retryable response is returned as it is.
//
// # Results
//
// ResultOf reports, for a response the Transport returned, the key that was
// sent, how many attempts were made and whether the final response was a
// replay (Idempotency-Replayed: true). The Result travels in the context of
// the response's Request, so nothing extra goes over the wire. When no
// response comes back, the *Error returned carries the same Result, so that
// the caller can try again later with the same key.
package idemclient

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem"
)

// Header names the Transport reads and writes.
const (
	// HeaderKey is the request field carrying the idempotency key.
	HeaderKey = idem.HeaderKey
	// HeaderReplayed is the response field with which idem (and other
	// servers) mark a replayed response with "true".
	HeaderReplayed = idem.HeaderReplayed
)

// Defaults of Config.
const (
	DefaultMaxAttempts     = 4
	DefaultMaxElapsed      = 30 * time.Second
	DefaultBackoffBase     = 100 * time.Millisecond
	DefaultBackoffCap      = 5 * time.Second
	DefaultMaxBufferedBody = 1 << 20
	// MaxKeyLength is the longest key a KeyFunc may return; servers
	// running idem reject longer ones.
	MaxKeyLength = idem.MaxKeyLength
)

// ErrBodyNotReplayable is wrapped by the error RoundTrip returns when an
// attempt failed in a way that would be retried, but the request body could
// not be sent again: it had no GetBody and was larger than
// Config.MaxBufferedBody, or GetBody failed. Whether the server executed the
// request is unknown; retry it yourself with the same key (Error.Result.Key)
// once you can produce the body again.
var ErrBodyNotReplayable = errors.New("idemclient: the request body cannot be sent again")

// Config configures a Transport. A nil *Config means every default, and so
// does each zero field.
type Config struct {
	// Methods are the request methods that get a key and retries; requests
	// with other methods pass through untouched. Defaults to POST and PATCH.
	Methods []string

	// MaxAttempts bounds the attempts made for one request, the first
	// included; 1 adds keys without retrying. Defaults to 4.
	MaxAttempts int

	// MaxElapsed bounds the time from the start of RoundTrip to the start
	// of the last attempt: no wait that would end later begins. The
	// request's context deadline, if earlier, bounds it too. Defaults to 30
	// seconds.
	MaxElapsed time.Duration

	// BackoffBase is the ceiling of the first wait between attempts when
	// the server gives no Retry-After; each further attempt doubles the
	// ceiling, up to BackoffCap, and the wait is drawn uniformly between
	// zero and the ceiling (full jitter), so that clients that failed
	// together do not retry together. Defaults to 100 milliseconds.
	BackoffBase time.Duration

	// BackoffCap is the largest back-off ceiling. A Retry-After from the
	// server overrides the back-off and is not capped by it: it is bounded
	// by MaxElapsed and the context deadline instead. Defaults to 5 seconds.
	BackoffCap time.Duration

	// MaxBufferedBody is the largest request body, in bytes, that is read
	// into memory so that it can be sent again, when the request has no
	// GetBody. Defaults to 1 MiB.
	MaxBufferedBody int64

	// KeyFunc returns the key for a request that has none; it must be 1 to
	// MaxKeyLength printable ASCII characters, unique per logical
	// operation. It is called once per RoundTrip, before the first attempt.
	// Defaults to a random UUID (version 4, from crypto/rand).
	KeyFunc func(req *http.Request) (string, error)

	// AttemptFunc, if set, is called after every attempt, before any wait,
	// with the attempt's request (read-only; its body is consumed) and what
	// happened. Use it for logs and metrics. Defaults to none.
	AttemptFunc func(req *http.Request, a Attempt)
}

// Attempt describes one attempt of a request, for Config.AttemptFunc.
type Attempt struct {
	// Key is the idempotency key sent, without Structured Field quoting.
	Key string
	// Number counts the attempts of the request, from 1.
	Number int
	// StatusCode is the response status, or 0 when Err is set.
	StatusCode int
	// Err is the transport error of the attempt, if any.
	Err error
	// Retry reports that another attempt follows after Delay.
	Retry bool
	// Delay is the wait before the next attempt.
	Delay time.Duration
}

// Error is the error RoundTrip returns for a request it managed, once at
// least the key is known: the final attempt's transport error, the
// caller's context ending during a wait, or a body that cannot be sent
// again. Its Result holds the key, so that the caller can retry later with
// the same key (set it on the request) and still be deduplicated. Through an
// http.Client it arrives wrapped in a *url.Error; use errors.As.
type Error struct {
	Result Result
	Err    error
}

func (e *Error) Error() string {
	// The key is left out: keys built from order or user identifiers do
	// not belong in logs.
	return fmt.Sprintf("idemclient: after %d attempt(s): %v", e.Result.Attempts, e.Err)
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Result describes how a response was obtained; see ResultOf.
type Result struct {
	// Key is the idempotency key that was sent on every attempt, without
	// Structured Field quoting.
	Key string
	// Attempts is the number of attempts made, at least 1.
	Attempts int
	// Replayed reports that the final response carried
	// Idempotency-Replayed: true: the server had already executed the
	// request and answered from its record.
	Replayed bool
}

// resultKey is the context key of the *Result in a returned response's
// Request.
type resultKey struct{}

// ResultOf returns the Result of a response returned by a Transport (also
// through an http.Client), and false for any other response, including
// those of requests that passed through untouched.
func ResultOf(resp *http.Response) (Result, bool) {
	if resp == nil || resp.Request == nil {
		return Result{}, false
	}
	r, ok := resp.Request.Context().Value(resultKey{}).(*Result)
	if !ok {
		return Result{}, false
	}
	return *r, true
}

// Transport is an http.RoundTripper that adds idempotency keys and retries;
// see the package documentation. It is safe for concurrent use.
type Transport struct {
	base http.RoundTripper
	cfg  Config
}

var _ http.RoundTripper = (*Transport)(nil)

// New returns a Transport that sends requests through base
// (http.DefaultTransport if nil). A nil cfg means all defaults; an invalid
// value is an error.
func New(base http.RoundTripper, cfg *Config) (*Transport, error) {
	if base == nil {
		base = http.DefaultTransport
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Methods == nil {
		c.Methods = []string{http.MethodPost, http.MethodPatch}
	} else {
		c.Methods = slices.Clone(c.Methods)
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MaxElapsed == 0 {
		c.MaxElapsed = DefaultMaxElapsed
	}
	if c.BackoffBase == 0 {
		c.BackoffBase = DefaultBackoffBase
	}
	if c.BackoffCap == 0 {
		c.BackoffCap = DefaultBackoffCap
	}
	if c.MaxBufferedBody == 0 {
		c.MaxBufferedBody = DefaultMaxBufferedBody
	}
	if c.KeyFunc == nil {
		c.KeyFunc = newUUID
	}
	switch {
	case c.MaxAttempts < 0:
		return nil, errors.New("idemclient: MaxAttempts is negative")
	case c.MaxElapsed < 0:
		return nil, errors.New("idemclient: MaxElapsed is negative")
	case c.BackoffBase < 0:
		return nil, errors.New("idemclient: BackoffBase is negative")
	case c.BackoffCap < c.BackoffBase:
		return nil, fmt.Errorf("idemclient: BackoffCap %v is less than BackoffBase %v", c.BackoffCap, c.BackoffBase)
	case c.MaxBufferedBody < 0:
		return nil, errors.New("idemclient: MaxBufferedBody is negative")
	}
	return &Transport{base: base, cfg: c}, nil
}

// NewClient returns an http.Client whose transport is New(nil, cfg).
func NewClient(cfg *Config) (*http.Client, error) {
	t, err := New(nil, cfg)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// CloseIdleConnections closes the idle connections of the base
// RoundTripper, if it has such a method, so that http.Client's method of
// the same name reaches it.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip sends req, with a key and retries if its method is in
// Config.Methods; see the package documentation. Like every RoundTripper it
// closes req.Body, also on error.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !slices.Contains(t.cfg.Methods, req.Method) {
		return t.base.RoundTrip(req)
	}
	start := time.Now()
	res := &Result{}
	var keyField []string // set when the Transport supplies the key
	if vs := req.Header.Values(HeaderKey); len(vs) > 0 {
		res.Key = unquoteKey(vs[0])
	} else if key, ok := req.Context().Value(ctxKeyKey{}).(string); ok {
		if err := checkKey(key); err != nil {
			closeBody(req)
			return nil, fmt.Errorf("idemclient: WithKey: %w", err)
		}
		res.Key, keyField = key, []string{idem.FormatKey(key)}
	} else {
		key, err := t.cfg.KeyFunc(req)
		if err == nil {
			err = checkKey(key)
		}
		if err != nil {
			closeBody(req)
			return nil, fmt.Errorf("idemclient: KeyFunc: %w", err)
		}
		res.Key, keyField = key, []string{idem.FormatKey(key)}
	}
	body, err := t.replayable(req)
	if err != nil {
		return nil, err
	}

	ctx := context.WithValue(req.Context(), resultKey{}, res)
	deadline := start.Add(t.cfg.MaxElapsed)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for n := 1; ; n++ {
		r := req.Clone(ctx)
		if keyField != nil {
			r.Header[HeaderKey] = keyField
		}
		if err := body.set(r, n); err != nil {
			return nil, &Error{Result: *res, Err: fmt.Errorf("%w: GetBody: %w", ErrBodyNotReplayable, err)}
		}
		res.Attempts = n
		resp, err := t.base.RoundTrip(r)

		delay, retry := t.retryDecision(r.Context(), n, resp, err)
		if retry && !body.again {
			if err != nil {
				err = fmt.Errorf("%w: %w", ErrBodyNotReplayable, err)
			}
			retry = false
		}
		if retry && (n >= t.cfg.MaxAttempts || delay > time.Until(deadline)) {
			retry = false
		}
		if t.cfg.AttemptFunc != nil {
			a := Attempt{Key: res.Key, Number: n, Err: err, Retry: retry}
			if resp != nil {
				a.StatusCode = resp.StatusCode
			}
			if retry {
				a.Delay = delay
			}
			t.cfg.AttemptFunc(r, a)
		}
		if !retry {
			if err != nil {
				return nil, &Error{Result: *res, Err: err}
			}
			res.Replayed = resp.Header.Get(HeaderReplayed) == "true"
			resp.Request = r
			return resp, nil
		}
		discard(resp)
		if err := sleep(ctx, delay); err != nil {
			return nil, &Error{Result: *res, Err: err}
		}
	}
}

// ctxKeyKey is the context key of WithKey's key.
type ctxKeyKey struct{}

// WithKey returns a context that makes the Transport send key with a
// request that has no Idempotency-Key field of its own, instead of calling
// Config.KeyFunc. Use it for a key that must survive the caller's
// restarts: a key derived from the caller's own idempotent operation
// (see WithDerivedKey), or one stored next to the caller's data.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, ctxKeyKey{}, key)
}

// WithDerivedKey is WithKey with the key idem.DeriveKey derives for step
// from the idempotent execution ctx belongs to: a handler behind idem's
// middleware (or an operation of idem.Executor) that calls a provider sends
// the same key on every attempt, retry, take-over and reconciliation of the
// same client request, so the provider runs the call once. It returns
// idem.ErrNoExecution outside an execution.
func WithDerivedKey(ctx context.Context, step string) (context.Context, error) {
	key, err := idem.DeriveKey(ctx, step)
	if err != nil {
		return ctx, err
	}
	return WithKey(ctx, key), nil
}

// retryDecision says whether an attempt's outcome is worth another attempt,
// and after what wait.
func (t *Transport) retryDecision(ctx context.Context, n int, resp *http.Response, err error) (time.Duration, bool) {
	if err != nil {
		if ctx.Err() != nil || permanent(err) {
			return 0, false
		}
		return t.backoff(n), true
	}
	ra, hasRA := retryAfter(resp.Header.Get("Retry-After"))
	switch resp.StatusCode {
	case http.StatusConflict:
		// Only "in progress" comes with Retry-After; the other conflicts
		// (a key reused with another request, a response that cannot be
		// replayed) will not change.
		return ra, hasRA
	case http.StatusTooManyRequests, http.StatusServiceUnavailable,
		http.StatusBadGateway, http.StatusGatewayTimeout:
		if hasRA {
			return ra, true
		}
		return t.backoff(n), true
	}
	return 0, false
}

// backoff returns the full-jitter wait after attempt n: uniform in
// [0, min(BackoffCap, BackoffBase * 2^(n-1))].
func (t *Transport) backoff(n int) time.Duration {
	ceiling := t.cfg.BackoffCap
	if n-1 < 62 && t.cfg.BackoffBase <= t.cfg.BackoffCap>>(n-1) {
		ceiling = t.cfg.BackoffBase << (n - 1)
	}
	if ceiling <= 0 {
		return 0
	}
	return mrand.N(ceiling + 1)
}

// retryAfter parses a Retry-After value: delay-seconds or an HTTP-date
// (RFC 9110 section 10.2.3). A date in the past means no wait.
func retryAfter(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			if errors.Is(err, strconv.ErrRange) {
				return math.MaxInt64, true
			}
			return 0, false
		}
		if s > uint64(math.MaxInt64/int64(time.Second)) {
			return math.MaxInt64, true
		}
		return time.Duration(s) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(time.Until(at), 0), true
}

// permanent reports transport errors that a retry cannot fix.
func permanent(err error) bool {
	var (
		certErr     *tls.CertificateVerificationError
		unknownAuth x509.UnknownAuthorityError
		hostErr     x509.HostnameError
		invalidErr  x509.CertificateInvalidError
		dnsErr      *net.DNSError
	)
	switch {
	case errors.As(err, &certErr), errors.As(err, &unknownAuth),
		errors.As(err, &hostErr), errors.As(err, &invalidErr):
		return true
	case errors.As(err, &dnsErr):
		return dnsErr.IsNotFound
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
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

// maxDrain bounds what is read from a discarded response so that its
// connection can be reused; a longer body costs its connection instead.
const maxDrain = 64 << 10

// discard drains and closes the body of a response that will not be
// returned.
func discard(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	_ = resp.Body.Close()
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		_ = req.Body.Close()
	}
}

// requestBody supplies the body of each attempt.
type requestBody struct {
	// again reports that the body can be sent more than once.
	again bool
	// first, if set, replaces req.Body on the first attempt.
	first io.ReadCloser
	// buffered reports that the Transport read the body into buf.
	buffered bool
	buf      []byte
	// getBody is the caller's req.GetBody.
	getBody func() (io.ReadCloser, error)
}

// replayable works out how to send req's body more than once, reading it
// into memory if needed. On error it has closed req.Body.
func (t *Transport) replayable(req *http.Request) (*requestBody, error) {
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		return &requestBody{again: true}, nil
	case req.GetBody != nil:
		return &requestBody{again: true, getBody: req.GetBody}, nil
	case req.ContentLength > t.cfg.MaxBufferedBody:
		return &requestBody{}, nil
	}
	limit := t.cfg.MaxBufferedBody
	buf, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		closeBody(req)
		return nil, fmt.Errorf("idemclient: reading the request body: %w", err)
	}
	if int64(len(buf)) > limit {
		// Too large to keep: send what was read, then the rest, once.
		return &requestBody{first: &prefixedBody{Reader: io.MultiReader(bytes.NewReader(buf), req.Body), closer: req.Body}}, nil
	}
	if err := req.Body.Close(); err != nil {
		return nil, fmt.Errorf("idemclient: closing the request body: %w", err)
	}
	return &requestBody{again: true, buffered: true, buf: buf}, nil
}

// set gives attempt n, the clone r, its body. A clone starts with the
// caller's req.Body, which is right for the first attempt unless the
// Transport has read it.
func (b *requestBody) set(r *http.Request, n int) error {
	switch {
	case b.buffered:
		r.Body = io.NopCloser(bytes.NewReader(b.buf))
		// The base transport may replay too (net/http retries a request
		// with an Idempotency-Key on a dead kept-alive connection).
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b.buf)), nil }
		if r.ContentLength <= 0 {
			r.ContentLength = int64(len(b.buf))
		}
	case n == 1:
		if b.first != nil {
			r.Body = b.first
		}
	case b.getBody != nil:
		body, err := b.getBody()
		if err != nil {
			return err
		}
		r.Body = body
	}
	return nil
}

// prefixedBody sends the part of a body that was read ahead, then the rest.
type prefixedBody struct {
	io.Reader
	closer io.Closer
}

func (p *prefixedBody) Close() error { return p.closer.Close() }

// newUUID returns a random version 4 UUID: the key form most servers that
// validate keys accept.
func newUUID(*http.Request) (string, error) {
	var u [16]byte
	_, _ = rand.Read(u[:]) // never fails (crypto/rand.Read's contract)
	u[6] = u[6]&0x0f | 0x40
	u[8] = u[8]&0x3f | 0x80
	const hex = "0123456789abcdef"
	var b [36]byte
	j := 0
	for i, c := range u {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			b[j] = '-'
			j++
		}
		b[j], b[j+1] = hex[c>>4], hex[c&0x0f]
		j += 2
	}
	return string(b[:]), nil
}

// checkKey accepts exactly the keys an idem server accepts.
func checkKey(k string) error {
	if got, err := idem.ParseKey([]string{idem.FormatKey(k)}); err != nil || got != k {
		return fmt.Errorf("key %q is not 1 to %d printable ASCII characters", k, MaxKeyLength)
	}
	return nil
}

// unquoteKey returns the key named by a field value in either the
// Structured Field string form or the bare form. It does not validate: a
// caller-set value is sent as it is, and the server judges it.
func unquoteKey(v string) string {
	if k, err := idem.ParseKey([]string{v}); err == nil {
		return k
	}
	return strings.Trim(v, " \t")
}
