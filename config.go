package idem

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/idemcrypt"
)

// Header names idem reads and writes.
const (
	// HeaderKey is the request field carrying the idempotency key; idem
	// echoes it (in Structured Field string form) on every response for a
	// request with a valid key.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is "true" on a replayed response and "false" on every
	// other response idem handles.
	HeaderReplayed = "Idempotency-Replayed"
	// HeaderExpiresAt carries, in RFC 3339 UTC, when the record for the key
	// expires: until then retries replay; afterwards the key is new again.
	HeaderExpiresAt = "Idempotency-Key-Expires-At"
)

// Defaults of Config.
const (
	DefaultLease           = 30 * time.Second
	DefaultTTL             = 24 * time.Hour
	DefaultRetryAfter      = time.Second
	DefaultStoreTimeout    = 5 * time.Second
	DefaultMaxRequestBody  = 1 << 20
	DefaultMaxResponseBody = 1 << 20
	// MinLease is the shortest lease Config accepts: renewal runs every
	// third of a lease and must have time to reach the store.
	MinLease = 50 * time.Millisecond
	// MaxTTL is the longest TTL (and so the longest lease) Config accepts,
	// ten years: the clock's reading plus a TTL must stay far inside the
	// range of time.Time and of every store's timestamps. (A duration near
	// time.Duration's maximum of 292 years would wrap the expiry into the
	// past, and every request would lose its lease at once.) StoreTimeout,
	// Wait and RetryAfter are bounded by it too.
	MaxTTL = 10 * 365 * 24 * time.Hour
)

// KeyRequirement says whether requests must, may or must not carry a key.
type KeyRequirement int

const (
	// KeyByMethod requires a key for the methods in Config.RequiredMethods
	// and passes every other request through untouched. It is the default.
	KeyByMethod KeyRequirement = iota
	// KeyRequired requires a key on every request (400 without one).
	KeyRequired
	// KeyOptional protects requests that carry a key and passes the others
	// through.
	KeyOptional
	// KeyOff passes every request through untouched.
	KeyOff
)

// Outcome is what the outcome policy decides for a finished operation.
type Outcome int

const (
	// OutcomeStore completes the record with the response; retries replay
	// it.
	OutcomeStore Outcome = iota + 1
	// OutcomeRelease deletes the record; the client may retry with the same
	// key and the operation runs again.
	OutcomeRelease
)

// DefaultOutcome is the default outcome policy: store 2xx, 3xx and
// deterministic 4xx responses; release on 5xx and on 408 (Request Timeout),
// 425 (Too Early) and 429 (Too Many Requests), which invite a retry.
func DefaultOutcome(status int) Outcome {
	switch {
	case status >= 500, status == http.StatusRequestTimeout,
		status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return OutcomeRelease
	}
	return OutcomeStore
}

// Config configures an Executor or a Middleware. A nil *Config means every
// default, and so does each zero field. The fields, in this order, by what
// they govern:
//
//   - records: Lease, TTL, Wait, RetryAfter, ClaimInTx, OutcomeFunc;
//   - the store and the clock: StoreTimeout, NowFunc;
//   - secrets: Encryption, DeriveKeySecret;
//   - observability: Observer, Logger;
//   - which requests need a key, and how they are identified (Middleware
//     only): Requirement, RequiredMethods, KeyHeader, ValidateKeyFunc,
//     TenantFunc, OperationFunc, FingerprintFunc, FingerprintExclude,
//     FingerprintInclude;
//   - limits and answers (Middleware only): MaxRequestBody,
//     MaxResponseBody, ReplayDenyHeaders, FailOpen, ProblemBaseURL,
//     ErrorFunc.
//
// NewExecutor refuses a Config that sets a field marked "Middleware only":
// the Executor has no request to apply it to, and a setting that is
// silently ignored is a setting someone relies on in vain.
type Config struct {
	// Records.

	// Lease is how long a claim owns a record without renewal. The owner
	// renews it every third of a lease while the operation runs, so an
	// operation may run longer than one lease; a crashed owner's record can
	// be taken over once its lease has passed. Defaults to 30 seconds; at
	// least MinLease.
	Lease time.Duration

	// TTL is how long a record is retained, counted from the claim that
	// executed the operation. Retries within it replay; afterwards the key
	// is new again. Defaults to 24 hours.
	TTL time.Duration

	// Wait, when positive, lets a duplicate of an in-flight request wait up
	// to this long for the first attempt and then replay its response,
	// instead of answering 409 at once. Waiting goes through the store (a
	// Watcher if it has one, otherwise polling with exponential back-off),
	// so it works across processes. Defaults to 0: no waiting.
	Wait time.Duration

	// RetryAfter is the Retry-After value sent with 409 (in progress) and
	// 503 (store unavailable, lease lost), rounded up to whole seconds.
	// Defaults to 1 second.
	RetryAfter time.Duration

	// ClaimInTx claims a new key inside the operation's transaction, so
	// that the claim, the operation's writes and the stored response
	// commit once, together (one commit per first execution instead of
	// two). It needs a store that implements TxClaimer (sqlitestore,
	// pgstore); NewExecutor and NewMiddleware refuse it otherwise.
	//
	// Use it only for operations whose effects are all written through
	// the execution's transaction (TxFromContext), and that are short:
	//
	//   - the transaction is open for the whole operation, from the claim
	//     on (on SQLite it holds the file's only write lock);
	//   - a duplicate cannot see an uncommitted claim: it waits for the
	//     transaction up to a bound of the store's (then 409), or replays
	//     what it committed, so the 409 window of a slow operation is
	//     shorter than with separate claims;
	//   - Step is refused (ErrStepsUnsupported) while the claim is not
	//     committed: a recovery point would commit it without a lease
	//     renewal running;
	//   - an effect outside the transaction (a call to another service)
	//     could happen twice: the claim that guards it is invisible until
	//     the commit.
	//
	// A key whose record is taken over after an expired lease is claimed
	// as without ClaimInTx. Defaults to false: each claim commits on its
	// own, before the operation runs.
	ClaimInTx bool

	// OutcomeFunc decides, from the response status, whether a finished
	// operation is stored or released. Defaults to DefaultOutcome.
	OutcomeFunc func(status int) Outcome

	// The store and the clock.

	// StoreTimeout bounds every store call: the claim, each lease renewal,
	// beginning the operation's transaction, and each call that records the
	// outcome (complete, commit, rollback, release), as well as a Watch
	// registration in wait mode. A store that stops answering (connections
	// open, nothing answers) thus yields 503 idempotency.store_unavailable
	// with Retry-After within StoreTimeout, never a request that hangs for
	// as long as its client waits. The calls made after the operation ran
	// do not use the request's cancellation, so a client that disconnects
	// cannot cancel the recording of work that was done. A memstore.Store
	// (not a store wrapping one) without Encryption cannot stall: its
	// claim, complete and release get no deadline. Defaults to 5 seconds.
	StoreTimeout time.Duration

	// NowFunc is the clock: it supplies Now to every store call (stores with
	// their own server clock ignore it) and times events. Defaults to
	// time.Now.
	NowFunc func() time.Time

	// Secrets.

	// Encryption, when set, encrypts every stored response and recovery
	// point and binds each to its record (and, with
	// idemcrypt.Config.HashKey, hashes the scope and key the stores see).
	// A record that cannot be decrypted is answered with
	// ErrRecordUnreadable (503), never replayed, resumed or executed
	// again. See idemcrypt.New. Defaults to nil: responses and recovery
	// points are stored as they are, and an encrypted record is
	// unreadable.
	Encryption *idemcrypt.Encryption

	// DeriveKeySecret keys the HMAC-SHA256 of DeriveKey, so that a derived
	// key sent to a provider reveals nothing of the client's key, not even
	// to someone who can guess it. Keep it secret, the same in every
	// instance and across restarts (a new secret derives new keys, and a
	// provider would charge a resumed operation again). At least 16 bytes.
	// Defaults to none: DeriveKey then hashes with SHA-256 under a domain
	// separator, which hides the key but lets anyone who guesses the
	// client's key compute the derived one.
	DeriveKeySecret []byte

	// Observability.

	// Observer is told about every outcome. Defaults to none.
	Observer Observer

	// Logger receives warnings and errors (store failures, lost leases,
	// take-overs). Keys appear only as RedactKey gives them: clients
	// sometimes build keys from order or user identifiers. Defaults to
	// slog.Default().
	Logger *slog.Logger

	// Which requests need a key, and how they are identified (Middleware only).

	// Requirement says which requests need a key. Middleware only. Defaults
	// to KeyByMethod.
	Requirement KeyRequirement

	// RequiredMethods are the methods that need a key under KeyByMethod.
	// Middleware only. Defaults to POST and PATCH.
	RequiredMethods []string

	// KeyHeader names the request field the key is read from (and echoed
	// in on the response), for requests that carry their own identifier
	// instead of an Idempotency-Key: inbound webhooks such as Standard
	// Webhooks' "webhook-id" or GitHub's "X-GitHub-Delivery". The value is
	// parsed as ParseKey parses an Idempotency-Key. Scope such routes by
	// sender (TenantFunc), since senders choose their ids. Middleware only.
	// Defaults to HeaderKey ("Idempotency-Key").
	KeyHeader string

	// ValidateKeyFunc narrows the keys accepted beyond ParseKey's rules
	// (for example, to UUIDs). A non-nil error is answered with 400
	// idempotency.key_invalid and the error's text as detail. Middleware
	// only. Defaults to none.
	ValidateKeyFunc func(key string) error

	// TenantFunc returns the tenant or principal a request belongs to; the
	// record scope is this tenant plus the operation, so tenants never see
	// each other's records. An error is answered as it is if it is a
	// *Problem, and otherwise with 400 idempotency.scope_invalid. Middleware
	// only. Defaults to a single scope for everyone.
	TenantFunc func(r *http.Request) (string, error)

	// OperationFunc names the operation a request invokes. Middleware only.
	// Defaults to the request's ServeMux pattern (http.Request.Pattern) or,
	// without one, the method and the URL path.
	OperationFunc func(r *http.Request) string

	// FingerprintFunc, if set, returns the payload to fingerprint instead of
	// the canonicalised body: a normalised form (so that "usd" and "USD" are
	// one request) or selected fields. It runs before the key is claimed,
	// so it is also the place to reject invalid requests without consuming
	// the key: an error is answered as it is if it is a *Problem, and
	// otherwise with 400 idempotency.body_invalid. Returning (nil, nil) uses
	// the default fingerprint. Middleware only.
	FingerprintFunc func(r *http.Request, body []byte) ([]byte, error)

	// FingerprintExclude lists JSON Pointers (RFC 6901, such as
	// "/metadata/client_time") of members or array elements of a JSON body
	// that the fingerprint leaves out: a retry that differs only in them
	// replays instead of getting 422. Use it for fields clients regenerate
	// on every attempt (timestamps, trace IDs, nonces). What it risks: two
	// requests that differ only in an excluded field share a fingerprint,
	// so the second replays the first's response and its own value is
	// never acted on; exclude nothing the operation reads. Pointers to
	// absent members are ignored. Bodies that are not JSON are
	// fingerprinted whole. Cannot be combined with FingerprintInclude; a
	// FingerprintFunc that returns a payload takes precedence. Middleware
	// only. Defaults to none.
	FingerprintExclude []string

	// FingerprintInclude, if set, fingerprints only the members of a JSON
	// body at these JSON Pointers (with the method, operation and target,
	// as always): a retry may differ in anything else. What it risks is
	// larger than FingerprintExclude's: a field the operation reads but the
	// list forgets makes different requests look like retries of each
	// other. An absent member and a null one are told apart. Middleware
	// only. Defaults to the whole body.
	FingerprintInclude []string

	// Limits and answers (Middleware only).

	// MaxRequestBody is the largest request body, in bytes, that a
	// protected request may carry; larger ones are answered with 413 before
	// any key is claimed. Middleware only. Defaults to 1 MiB.
	MaxRequestBody int64

	// MaxResponseBody is the largest response body, in bytes, that is
	// stored for replay. A larger response is still sent in full to the
	// first client, and the record completes without a body (see
	// Response.Unreplayable). Middleware only. Defaults to 1 MiB.
	MaxResponseBody int

	// ReplayDenyHeaders are response header fields that are never stored
	// or replayed, in addition to the hop-by-hop fields and Date, which
	// never are. Middleware only. Defaults to Set-Cookie and Set-Cookie2;
	// set an empty, non-nil slice to store every other field.
	ReplayDenyHeaders []string

	// FailOpen runs the handler without protection when the store cannot
	// be reached, instead of answering 503. Use it only on routes where a
	// duplicate is cheaper than an outage. Middleware only. Defaults to
	// false: fail closed.
	FailOpen bool

	// ProblemBaseURL is the base of the "type" URI of idem's own problems:
	// the problem code is appended to it (so a base ending in "#" names an
	// anchor per code), and WriteProblem also sends the URI in a Link
	// field with rel="describedby". Point it at your own copy of the
	// documentation, if clients cannot reach GitHub. Middleware only.
	// Defaults to DefaultProblemBaseURL (docs/semantics.md on GitHub).
	ProblemBaseURL string

	// ErrorFunc writes every error response idem produces. The idempotency
	// headers are already set on w. Middleware only. Defaults to
	// WriteProblem.
	ErrorFunc func(w http.ResponseWriter, r *http.Request, p *Problem)
}

// middlewareOnlySet returns the name of the first field marked
// "Middleware only" that c sets, or "".
func (c *Config) middlewareOnlySet() string {
	if c == nil {
		return ""
	}
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"Requirement", c.Requirement != KeyByMethod},
		{"RequiredMethods", c.RequiredMethods != nil},
		{"KeyHeader", c.KeyHeader != ""},
		{"ValidateKeyFunc", c.ValidateKeyFunc != nil},
		{"TenantFunc", c.TenantFunc != nil},
		{"OperationFunc", c.OperationFunc != nil},
		{"FingerprintFunc", c.FingerprintFunc != nil},
		{"FingerprintExclude", c.FingerprintExclude != nil},
		{"FingerprintInclude", c.FingerprintInclude != nil},
		{"MaxRequestBody", c.MaxRequestBody != 0},
		{"MaxResponseBody", c.MaxResponseBody != 0},
		{"ReplayDenyHeaders", c.ReplayDenyHeaders != nil},
		{"FailOpen", c.FailOpen},
		{"ProblemBaseURL", c.ProblemBaseURL != ""},
		{"ErrorFunc", c.ErrorFunc != nil},
	} {
		if f.set {
			return f.name
		}
	}
	return ""
}

// resolve returns a copy of c with defaults filled in, or an error for a
// value that cannot work.
func (c *Config) resolve() (Config, error) {
	var r Config
	if c != nil {
		r = *c
	}
	if r.Lease == 0 {
		r.Lease = DefaultLease
	}
	if r.Lease < MinLease {
		return r, fmt.Errorf("idem: Lease %v is shorter than MinLease %v", r.Lease, MinLease)
	}
	if r.TTL == 0 {
		r.TTL = DefaultTTL
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"Lease", r.Lease}, {"TTL", r.TTL}, {"StoreTimeout", r.StoreTimeout}, {"Wait", r.Wait}, {"RetryAfter", r.RetryAfter}} {
		if d.v > MaxTTL {
			return r, fmt.Errorf("idem: %s %v is longer than MaxTTL %v (an expiry that far out overflows time)", d.name, d.v, MaxTTL)
		}
	}
	if r.TTL < r.Lease {
		return r, fmt.Errorf("idem: TTL %v is shorter than Lease %v", r.TTL, r.Lease)
	}
	if r.Wait < 0 {
		return r, errors.New("idem: Wait is negative")
	}
	if r.RetryAfter == 0 {
		r.RetryAfter = DefaultRetryAfter
	}
	if r.RetryAfter < 0 {
		return r, errors.New("idem: RetryAfter is negative")
	}
	if r.StoreTimeout == 0 {
		r.StoreTimeout = DefaultStoreTimeout
	}
	if r.StoreTimeout < 0 {
		return r, errors.New("idem: StoreTimeout is negative")
	}
	if r.OutcomeFunc == nil {
		r.OutcomeFunc = DefaultOutcome
	}
	if r.NowFunc == nil {
		r.NowFunc = time.Now
	}
	if n := len(r.DeriveKeySecret); n > 0 && n < 16 {
		return r, fmt.Errorf("idem: DeriveKeySecret has %d bytes, at least 16 are needed", n)
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	if r.Requirement < KeyByMethod || r.Requirement > KeyOff {
		return r, fmt.Errorf("idem: unknown Requirement %d", r.Requirement)
	}
	if r.RequiredMethods == nil {
		r.RequiredMethods = []string{http.MethodPost, http.MethodPatch}
	}
	if r.KeyHeader == "" {
		r.KeyHeader = HeaderKey
	}
	if !validFieldName(r.KeyHeader) {
		return r, fmt.Errorf("idem: KeyHeader %q is not a field name", r.KeyHeader)
	}
	r.KeyHeader = textproto.CanonicalMIMEHeaderKey(r.KeyHeader)
	if r.MaxRequestBody == 0 {
		r.MaxRequestBody = DefaultMaxRequestBody
	}
	if r.MaxRequestBody < 0 {
		return r, errors.New("idem: MaxRequestBody is negative")
	}
	if r.MaxResponseBody == 0 {
		r.MaxResponseBody = DefaultMaxResponseBody
	}
	if r.MaxResponseBody < 0 {
		return r, errors.New("idem: MaxResponseBody is negative")
	}
	if r.ReplayDenyHeaders == nil {
		r.ReplayDenyHeaders = []string{"Set-Cookie", "Set-Cookie2"}
	}
	if r.ProblemBaseURL == "" {
		r.ProblemBaseURL = DefaultProblemBaseURL
	}
	if _, err := newFieldSelection(r.FingerprintInclude, r.FingerprintExclude); err != nil {
		return r, err
	}
	if r.ErrorFunc == nil {
		r.ErrorFunc = func(w http.ResponseWriter, _ *http.Request, p *Problem) { WriteProblem(w, p) }
	}
	return r, nil
}

func (c *Config) retryAfterSeconds() int {
	s := int((c.RetryAfter + time.Second - 1) / time.Second)
	return max(s, 1)
}

// Scope returns the record scope for a tenant and an operation, as the
// middleware builds it. Non-HTTP callers of Executor.Do use it so that their
// records follow the same rule: one tenant's key never meets another's, and
// the same key on two operations names two records. The tenant is
// length-prefixed, so no choice of tenant can imitate another scope.
func Scope(tenant, operation string) string {
	return strconv.Itoa(len(tenant)) + ":" + tenant + "|" + operation
}

// RequestInfo describes the idempotent execution a handler runs in.
type RequestInfo struct {
	// Key is the idempotency key.
	Key string
	// Scope is the record scope (see Scope).
	Scope string
	// ExpiresAt is when the record expires.
	ExpiresAt time.Time
	// TookOver reports that this execution took over a record whose
	// previous owner's lease had expired.
	TookOver bool
	// Payload is what Config.FingerprintFunc returned for this request
	// (the validated, normalised payload), or nil. Read-only.
	Payload []byte
	// Fence is the execution's fencing token: greater than the token of
	// every earlier claim or take-over of the same key (zero on a store
	// without fences; see idemstore.Record.Fence). Send it with every write
	// to a downstream system that can compare it (a column, a header); the
	// downstream refuses a write whose token is lower than the highest it
	// has accepted for that key, so that an owner whose lease was taken
	// over, and which does not know it yet, cannot overwrite its
	// successor's work:
	//
	//	UPDATE accounts SET balance = $1, fence = $2
	//	WHERE id = $3 AND fence <= $2
	//
	// changes no row for a stale owner.
	Fence int64
}

// validFieldName reports whether s is an HTTP field name (an RFC 9110
// token).
func validFieldName(s string) bool {
	if s == "" || len(s) > 100 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
