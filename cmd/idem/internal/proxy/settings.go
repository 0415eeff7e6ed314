package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/canonjson"
)

// DefaultUpstreamTimeout is the default of Settings.UpstreamTimeout.
const DefaultUpstreamTimeout = 30 * time.Second

// DefaultScopeHeader is the default of Settings.ScopeHeader: requests that
// carry the same credential belong to the same client.
const DefaultScopeHeader = "Authorization"

// Settings are the idempotency settings of one route. The command-line
// flags set them for every route; a route in the configuration file
// overrides some of them. Settings has no implicit defaults (an empty
// ScopeHeader means "no scope", not "the default header"): start from
// DefaultSettings.
type Settings struct {
	// Key says which requests need an Idempotency-Key: KeyByMethod (the
	// Methods need one; other methods pass through untouched),
	// KeyRequired, KeyOptional (requests with a key are protected, others
	// pass through) or KeyOff (everything passes through).
	Key idem.KeyRequirement

	// Methods are the methods that need a key under KeyByMethod. HTTP
	// methods are case-sensitive.
	Methods []string

	// Lease is how long a claim holds a key without renewal; the proxy
	// renews it while the upstream works. After a proxy crash, a retry
	// runs again once the lease has passed.
	Lease time.Duration

	// TTL is how long a record (and the response replayed from it) is
	// kept.
	TTL time.Duration

	// Wait, when positive, lets a duplicate of a running request wait up
	// to this long and then replay its response, instead of answering 409
	// at once.
	Wait time.Duration

	// UpstreamTimeout bounds the upstream's answer. For a protected
	// request it covers the whole exchange (the response is buffered to be
	// stored); for a pass-through request it covers the wait for the
	// response header, after which the body streams for as long as it
	// takes. A timeout answers 504 and releases the key.
	UpstreamTimeout time.Duration

	// ScopeHeader names the request header whose value identifies the
	// client: records are scoped by a SHA-256 of its value, so one
	// client's keys never meet another's and the credential itself is
	// never stored. A protected request without the header (or with an
	// empty one) is refused with 400 proxy.scope_missing before anything
	// is claimed: it cannot be told apart from another client's, and
	// sharing a scope would hand one client another's stored response.
	// Empty means no scope, an explicit choice ("none" in flags and
	// files): all clients share one key space.
	ScopeHeader string

	// MaxRequestBody bounds the body of a protected request, which is
	// buffered to be fingerprinted (413 above it). Pass-through requests
	// stream and are not bounded by the proxy.
	MaxRequestBody int64

	// MaxResponseBody bounds the stored response body. A larger response
	// still reaches the first client in full; its record completes as
	// unreplayable, so a retry gets 409 idempotency.response_unavailable
	// and never a second execution.
	MaxResponseBody int64

	// Outcome decides which upstream statuses are stored and which
	// release the key. Nil means OutcomePolicy's defaults.
	Outcome *OutcomePolicy

	// FingerprintExclude and FingerprintInclude are JSON Pointers of
	// fields of a JSON request body that the fingerprint leaves out, or
	// the only ones it covers (idem.Config.FingerprintExclude and
	// FingerprintInclude, with their risks). At most one of them; both
	// empty means the whole body.
	FingerprintExclude, FingerprintInclude []string
}

// DefaultSettings returns the settings of the flags' defaults: POST and
// PATCH need a key, scope by the Authorization header, the core's lease,
// TTL and limits, a 30 s upstream timeout, no waiting.
func DefaultSettings() Settings {
	return Settings{
		Key:             idem.KeyByMethod,
		Methods:         []string{http.MethodPost, http.MethodPatch},
		Lease:           idem.DefaultLease,
		TTL:             idem.DefaultTTL,
		UpstreamTimeout: DefaultUpstreamTimeout,
		ScopeHeader:     DefaultScopeHeader,
		MaxRequestBody:  idem.DefaultMaxRequestBody,
		MaxResponseBody: idem.DefaultMaxResponseBody,
	}
}

// MaxDuration is the longest lease, TTL, wait or upstream timeout a route
// may have: the core's maximum TTL (10 years), beyond which an expiry
// overflows.
const MaxDuration = idem.MaxTTL

// humanDuration spells d in days, for messages.
func humanDuration(d time.Duration) string {
	return fmt.Sprintf("%d days", d/(24*time.Hour))
}

// fieldError is a problem with one setting, named as in the configuration
// file so that the file parser can point at its line.
type fieldError struct {
	field string
	msg   string
}

// check validates s. It returns every problem, named by field.
func (s Settings) check() []fieldError {
	var errs []fieldError
	add := func(field, format string, args ...any) {
		errs = append(errs, fieldError{field, fmt.Sprintf(format, args...)})
	}
	if s.Key < idem.KeyByMethod || s.Key > idem.KeyOff {
		add("key", "unknown key requirement %d", s.Key)
	}
	if s.Key == idem.KeyByMethod && len(s.Methods) == 0 {
		add("methods", "key: by-method needs at least one method")
	}
	for _, m := range s.Methods {
		if err := checkMethod(m); err != nil {
			add("methods", "%v", err)
		}
	}
	if s.Lease < idem.MinLease {
		add("lease", "lease %v is shorter than the minimum %v", s.Lease, idem.MinLease)
	}
	if s.TTL < s.Lease {
		add("ttl", "ttl %v is shorter than lease %v", s.TTL, s.Lease)
	}
	// Beyond MaxTTL an expiry time overflows (every request would then
	// fail with a lease lost in the 18th century): refused here, at start
	// and by --check-config, rather than by the first request.
	for _, d := range []struct {
		field string
		v     time.Duration
	}{{"lease", s.Lease}, {"ttl", s.TTL}, {"wait", s.Wait}, {"upstream_timeout", s.UpstreamTimeout}} {
		if d.v > MaxDuration {
			add(d.field, "%s %v is longer than the maximum %v (%s)", d.field, d.v, MaxDuration, humanDuration(MaxDuration))
		}
	}
	if s.Wait < 0 {
		add("wait", "wait %v is negative", s.Wait)
	}
	if s.UpstreamTimeout <= 0 {
		add("upstream_timeout", "upstream_timeout %v must be positive", s.UpstreamTimeout)
	}
	if s.ScopeHeader != "" && !validToken(s.ScopeHeader) {
		add("scope_header", "scope_header %q is not a valid header name", s.ScopeHeader)
	}
	if s.MaxRequestBody <= 0 {
		add("max_request_body", "max_request_body must be positive")
	}
	if s.MaxResponseBody <= 0 || s.MaxResponseBody > int64(^uint(0)>>1) {
		add("max_response_body", "max_response_body must be positive and fit in an int")
	}
	if len(s.FingerprintExclude) > 0 && len(s.FingerprintInclude) > 0 {
		add("fingerprint_include", "set fingerprint_include or fingerprint_exclude, not both")
	}
	for _, list := range []struct {
		field    string
		pointers []string
	}{{"fingerprint_exclude", s.FingerprintExclude}, {"fingerprint_include", s.FingerprintInclude}} {
		for _, ptr := range list.pointers {
			if tokens, err := canonjson.ParsePointer(ptr); err != nil {
				add(list.field, "%q is not a JSON Pointer (such as \"/order/client_time\")", ptr)
			} else if len(tokens) == 0 && list.field == "fingerprint_exclude" {
				add(list.field, "the empty pointer would exclude the whole body")
			}
		}
	}
	return errs
}

// Validate reports the first problem with s, if any.
func (s Settings) Validate() error {
	if errs := s.check(); len(errs) > 0 {
		return fmt.Errorf("%s: %s", errs[0].field, errs[0].msg)
	}
	return nil
}

// checkMethod accepts an HTTP method token. Methods are case-sensitive and
// every registered one is upper case, so a lower-case method is almost
// certainly a mistake that would never match.
func checkMethod(m string) error {
	if !validToken(m) {
		return fmt.Errorf("%q is not a valid HTTP method", m)
	}
	if strings.ToUpper(m) != m {
		return fmt.Errorf("method %q: methods are case-sensitive; write %q", m, strings.ToUpper(m))
	}
	return nil
}

// validToken reports whether s is an RFC 9110 token (the syntax of method
// and header field names).
func validToken[T string | []byte](s T) bool {
	if len(s) == 0 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// keyNames are the configuration names of the key requirements.
var keyNames = map[string]idem.KeyRequirement{
	"by-method": idem.KeyByMethod,
	"required":  idem.KeyRequired,
	"optional":  idem.KeyOptional,
	"off":       idem.KeyOff,
}

// KeyName returns the configuration name of a key requirement.
func KeyName(k idem.KeyRequirement) string {
	for name, v := range keyNames {
		if v == k {
			return name
		}
	}
	return strconv.Itoa(int(k))
}

// OutcomePolicy decides from an upstream status whether the response is
// stored (retries replay it) or the key is released (a retry runs again).
// Exact codes take precedence over classes ("5xx"); statuses it does not
// mention follow idem.DefaultOutcome (store 2xx, 3xx and 4xx; release 5xx,
// 408, 425 and 429). 502 and 504 are always released: the proxy answers
// them itself when the upstream cannot be reached or times out, and such
// an answer must never be replayed.
type OutcomePolicy struct {
	codes   map[int]idem.Outcome
	classes [6]idem.Outcome // index: first digit; zero = not set
}

// parseStatus parses an outcome list entry: a status code ("409") or a
// class ("4xx").
func parseStatus(s string) (code, class int, err error) {
	s = strings.TrimSpace(s)
	if len(s) == 3 && s[0] >= '1' && s[0] <= '5' && (s[1:] == "xx" || s[1:] == "XX") {
		return 0, int(s[0] - '0'), nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 100 || n > 599 {
		return 0, 0, fmt.Errorf("%q is not a status code (100-599) or class (such as 5xx)", s)
	}
	return n, 0, nil
}

// alwaysReleased reports whether a status is one the proxy itself answers
// for a failed exchange.
func alwaysReleased(code int) bool {
	return code == http.StatusBadGateway || code == http.StatusGatewayTimeout
}

// add records that entry (see parseStatus) has outcome o. It refuses to
// store 502 or 504 and entries listed twice.
func (p *OutcomePolicy) add(entry string, o idem.Outcome) error {
	code, class, err := parseStatus(entry)
	if err != nil {
		return err
	}
	if o == idem.OutcomeStore && (alwaysReleased(code) || class == 5) {
		return fmt.Errorf("%s cannot be stored: 502 and 504 are always released, because the proxy answers them itself when the upstream is unreachable or times out (list the other 5xx codes one by one)", strings.TrimSpace(entry))
	}
	if class > 0 {
		if p.classes[class] != 0 {
			return fmt.Errorf("%dxx is listed twice", class)
		}
		p.classes[class] = o
		return nil
	}
	if _, dup := p.codes[code]; dup {
		return fmt.Errorf("%d is listed twice", code)
	}
	if p.codes == nil {
		p.codes = map[int]idem.Outcome{}
	}
	p.codes[code] = o
	return nil
}

// NewOutcomePolicy returns the policy that stores the statuses in store and
// releases those in release (codes such as "409" or classes such as
// "4xx").
func NewOutcomePolicy(store, release []string) (*OutcomePolicy, error) {
	p := &OutcomePolicy{}
	for _, s := range store {
		if err := p.add(s, idem.OutcomeStore); err != nil {
			return nil, err
		}
	}
	for _, s := range release {
		if err := p.add(s, idem.OutcomeRelease); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Outcome decides the outcome of an upstream status. A nil policy is the
// default one.
func (p *OutcomePolicy) Outcome(status int) idem.Outcome {
	if alwaysReleased(status) {
		return idem.OutcomeRelease
	}
	if p != nil {
		if o, ok := p.codes[status]; ok {
			return o
		}
		if c := status / 100; c >= 1 && c <= 5 && p.classes[c] != 0 {
			return p.classes[c]
		}
	}
	return idem.DefaultOutcome(status)
}

// String lists the policy's entries, for `idem proxy --check-config`.
func (p *OutcomePolicy) String() string {
	if p == nil {
		return "default"
	}
	var store, release []string
	put := func(entry string, o idem.Outcome) {
		if o == idem.OutcomeStore {
			store = append(store, entry)
		} else {
			release = append(release, entry)
		}
	}
	for c := 1; c <= 5; c++ {
		if p.classes[c] != 0 {
			put(strconv.Itoa(c)+"xx", p.classes[c])
		}
	}
	codes := make([]int, 0, len(p.codes))
	for c := range p.codes {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	for _, c := range codes {
		put(strconv.Itoa(c), p.codes[c])
	}
	var parts []string
	if len(store) > 0 {
		parts = append(parts, "store "+strings.Join(store, " "))
	}
	if len(release) > 0 {
		parts = append(parts, "release "+strings.Join(release, " "))
	}
	return strings.Join(append(parts, "otherwise default"), "; ")
}

// CodeScopeMissing (400): a protected request lacks the header that
// scopes its records (Settings.ScopeHeader), so the proxy cannot keep its
// key apart from another client's. Nothing was claimed or forwarded.
const CodeScopeMissing = "proxy.scope_missing"

// NoScope is how flags and configuration files spell an empty
// ScopeHeader: no scope, every client in one key space.
const NoScope = "none"

// ParseScopeHeader turns a --scope-header or scope_header value into a
// ScopeHeader: "none" (any case) or "" is no scope.
func ParseScopeHeader(v string) string {
	if strings.EqualFold(strings.TrimSpace(v), NoScope) {
		return ""
	}
	return v
}

// scopeFunc returns the idem.Config.TenantFunc for a scope header: the
// client is a SHA-256 of the header's value, so that the credential itself
// never reaches the store; a request without the header is refused with
// CodeScopeMissing. Nil for no scope.
func scopeFunc(header string) func(*http.Request) (string, error) {
	if header == "" {
		return nil
	}
	name := textproto.CanonicalMIMEHeaderKey(header)
	missing := &idem.Problem{Status: http.StatusBadRequest, Code: CodeScopeMissing,
		Type:  problemTypeBase + CodeScopeMissing,
		Title: "The request does not say which client it comes from",
		Detail: "Idempotency records are kept per client, identified by the " + name + " header, which this request lacks. " +
			"Send it; requests without it cannot be told apart from another client's and are refused."}
	return func(r *http.Request) (string, error) {
		vs := r.Header[name]
		if len(vs) == 0 || len(vs) == 1 && strings.TrimSpace(vs[0]) == "" {
			p := *missing // the core may set fields of the problem it writes
			return "", &p
		}
		v := vs[0]
		if len(vs) > 1 {
			v = strings.Join(vs, "\n")
		}
		sum := sha256.Sum256([]byte(v))
		return hex.EncodeToString(sum[:]), nil
	}
}
