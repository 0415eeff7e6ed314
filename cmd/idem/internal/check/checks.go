package check

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Check names, in the order Run reports them.
const (
	nameMissing    = "missing-key"
	nameMalformed  = "malformed-keys"
	nameFirst      = "first-request"
	nameReplay     = "replay"
	nameKeyForms   = "key-forms"
	nameJSON       = "json-equivalence"
	nameMismatch   = "payload-mismatch"
	nameConcurrent = "concurrent-duplicates"
	nameTenants    = "tenant-isolation"
	nameProblem    = "problem-details"
	nameExpiry     = "expiry"
)

// Names returns the names of the checks Run performs, in order.
func Names() []string {
	return []string{nameMissing, nameMalformed, nameFirst, nameReplay, nameKeyForms, nameJSON,
		nameMismatch, nameConcurrent, nameTenants, nameProblem, nameExpiry}
}

// missingKey: a request without a key is refused with 400, not executed.
// Its transport error is Run's error: the endpoint cannot be reached.
func (r *runner) missingKey(ctx context.Context) (Check, error) {
	x := r.send(ctx, request{what: "no key", body: r.o.Body})
	if x.err != nil {
		return Check{}, x.err
	}
	c := Check{Name: nameMissing, Details: []string{x.String()}}
	switch {
	case x.status == http.StatusBadRequest:
		c.Status, c.Reason = Pass, "400 for a request without Idempotency-Key"
	case x.ok():
		c.Status, c.Reason = Fail, fmt.Sprintf("%d: the request was executed without an Idempotency-Key", x.status)
	case x.status >= 400 && x.status < 500:
		c.Status, c.Reason = Warn, fmt.Sprintf("refused with %d; the draft specifies 400", x.status)
	default:
		c.Status, c.Reason = Warn, fmt.Sprintf("%d for a request without Idempotency-Key; expected 400", x.status)
	}
	return c, nil
}

// malformedKeys: each malformed key is refused with 400. A 2xx means the
// endpoint executed a request whose key it cannot interpret reliably.
func (r *runner) malformedKeys(ctx context.Context) Check {
	long := newKey() + "-"
	long += strings.Repeat("x", 256-len(long))
	cases := []struct {
		name string
		q    request
	}{
		{"too long (256 characters)", request{keys: []string{quote(long)}}},
		{"two Idempotency-Key fields", request{keys: []string{quote(newKey()), quote(newKey())}}},
		{"a list value", request{keys: []string{quote(newKey()) + ", " + quote(newKey())}}},
		{"an empty value", request{keys: []string{""}}},
		{"an empty string", request{keys: []string{`""`}}},
		{"non-ASCII bytes", request{keys: []string{quote(newKey() + "-cl\u00e9")}, raw: true}},
		// HTTP servers often refuse control characters themselves, before
		// any idempotency layer, in their own format.
		{"a control character", request{keys: []string{quote(newKey() + "\x01")}, raw: true, serverLevel: true}},
	}
	c := Check{Name: nameMalformed}
	var executed, odd []string
	for _, tc := range cases {
		q := tc.q
		q.what, q.body = tc.name, r.o.Body
		x := r.send(ctx, q)
		c.Details = append(c.Details, x.String())
		switch {
		case x.err == nil && x.status == http.StatusBadRequest:
		case x.ok():
			executed = append(executed, tc.name)
		default:
			odd = append(odd, tc.name)
		}
	}
	switch {
	case len(executed) > 0:
		c.Status, c.Reason = Fail, "executed with a malformed key: "+strings.Join(executed, ", ")
	case len(odd) > 0:
		c.Status, c.Reason = Warn, "refused, but not with 400: "+strings.Join(odd, ", ")
	default:
		c.Status, c.Reason = Pass, fmt.Sprintf("400 for each of %d malformed keys", len(cases))
	}
	return c
}

// firstRequest: a request with a new key succeeds, if need be after
// retries with the same key. A 5xx that comes back as a replay means the
// endpoint stored a failure: that key can never succeed.
func (r *runner) firstRequest(ctx context.Context) Check {
	key := newKey()
	xs := r.execute(ctx, request{what: "first request", keys: []string{quote(key)}, body: r.o.Body})
	c := Check{Name: nameFirst, Details: describe(xs)}
	last := xs[len(xs)-1]
	switch {
	case last.ok() && len(xs) == 1:
		c.Status, c.Reason = Pass, fmt.Sprintf("%d for a request with a new key", last.status)
	case last.ok():
		c.Status, c.Reason = Pass, fmt.Sprintf("%d after %s with the same key (the first attempt got %s)", last.status, plural(len(xs)-1, "retry", "retries"), statusOf(xs[0]))
	case xs[0].status >= 500 && len(xs) > 1 && storedFailure(xs):
		c.Status, c.Reason = Fail, fmt.Sprintf("the %d was stored and replayed: retries with this key can never succeed (do not store 5xx)", xs[0].status)
	case last.err != nil:
		c.Status, c.Reason = Fail, "no response: "+last.err.Error()
	default:
		c.Status, c.Reason = Fail, fmt.Sprintf("the request failed with %d; the other checks need a successful request", last.status)
	}
	if last.ok() {
		r.first, r.key3 = last, key
		r.executed(last)
	}
	return c
}

// storedFailure reports whether a retry of a failed first attempt came
// back marked as a replay of it.
func storedFailure(xs []*exchange) bool {
	for _, x := range xs[1:] {
		if yes, _ := replayed(x); yes && x.status == xs[0].status {
			return true
		}
	}
	return false
}

// replay: the retry of a completed request gets the same status and body,
// byte for byte.
func (r *runner) replay(ctx context.Context) Check {
	c := Check{Name: nameReplay}
	if r.first == nil {
		c.Status, c.Reason = Skip, "needs a successful first request"
		return c
	}
	xs := r.settle(ctx, request{what: "retry", keys: []string{quote(r.key3)}, body: r.o.Body})
	c.Details = describe(xs)
	c.Status, c.Reason = r.judgeReplay(xs, r.first, "the retry")
	if c.Status == Pass {
		c.Reason = fmt.Sprintf("the retry got the stored %d and its %d-byte body, byte for byte", r.first.status, len(r.first.body))
		if name, v, ok := marker(xs[len(xs)-1].header); ok {
			c.Reason += fmt.Sprintf(" (%s: %s)", name, v)
		}
	}
	return c
}

// judgeReplay grades attempts xs (from settle) that should replay first.
func (r *runner) judgeReplay(xs []*exchange, first *exchange, what string) (Status, string) {
	last := xs[len(xs)-1]
	_, no := replayed(last)
	switch {
	case last.err != nil:
		return Fail, what + ": no response: " + last.err.Error()
	case last.same(first) && no:
		return Fail, what + " was executed again (its replay marker says false)"
	case last.same(first) && len(xs) > 1:
		return Warn, fmt.Sprintf("%s was answered 409 (in progress) before its replay: the response is stored after it is sent", what)
	case last.same(first):
		return Pass, ""
	case last.status == http.StatusConflict:
		return Warn, fmt.Sprintf("%s still gets 409 after the first request completed", what)
	case last.ok() && first.ok():
		return Fail, fmt.Sprintf("%s got %d with a different body: the request was executed again", what, last.status)
	default:
		return Fail, fmt.Sprintf("%s got %d, not the stored %d", what, last.status, first.status)
	}
}

// keyForms: "k" (a Structured Field string) and k (bare) name the same
// key.
func (r *runner) keyForms(ctx context.Context) Check {
	c := Check{Name: nameKeyForms}
	key := newKey()
	xs, first, ok := r.executeNew(ctx, &c, request{what: "quoted key", keys: []string{quote(key)}, body: r.o.Body})
	if !ok {
		return c
	}
	ys := r.settle(ctx, request{what: "same key, bare", keys: []string{key}, body: r.o.Body})
	c.Details = append(describe(xs), describe(ys)...)
	last := ys[len(ys)-1]
	c.Status, c.Reason = r.judgeReplay(ys, first, "the bare form of the key")
	switch {
	case c.Status == Pass:
		c.Reason = `the bare key k and the quoted "k" are one key (replayed)`
	case last.err == nil && last.status == http.StatusBadRequest:
		c.Status, c.Reason = Warn, "the bare form of a key is refused (400); only the quoted Structured Field form is accepted"
	case last.ok() && !last.same(first):
		c.Reason = "the bare form of the key names another key: the request was executed again"
	}
	return c
}

// jsonForms: the same JSON object with reordered members and other
// whitespace is the same request.
func (r *runner) jsonForms(ctx context.Context) Check {
	c := Check{Name: nameJSON}
	reordered, ok := reorderJSON(r.o.Body)
	if !ok {
		c.Status, c.Reason = Skip, "the body is not a JSON object"
		return c
	}
	key := newKey()
	xs, first, ok := r.executeNew(ctx, &c, request{what: "new key", keys: []string{quote(key)}, body: r.o.Body})
	if !ok {
		return c
	}
	ys := r.settle(ctx, request{what: "same key, members reordered", keys: []string{quote(key)}, body: reordered})
	c.Details = append(describe(xs), describe(ys)...)
	last := ys[len(ys)-1]
	c.Status, c.Reason = r.judgeReplay(ys, first, "the reordered body")
	switch {
	case c.Status == Pass:
		c.Reason = "reordered members and other whitespace are the same request (replayed)"
	case last.err == nil && last.status == http.StatusUnprocessableEntity:
		c.Status, c.Reason = Warn, "422 for the same JSON reordered: the fingerprint covers the bytes, not the JSON value"
	}
	return c
}

// payloadMismatch: a used key with another payload is refused with 422,
// and neither replays the old response nor executes.
func (r *runner) payloadMismatch(ctx context.Context) Check {
	c := Check{Name: nameMismatch}
	variant, how := r.o.Variant, "the given variant"
	if variant == nil {
		var ok bool
		variant, how, ok = deriveVariant(r.o.Body)
		if !ok {
			c.Status, c.Reason = Skip, "no variant payload given and the body is not a JSON object to derive one from"
			return c
		}
	}
	key := newKey()
	xs, first, ok := r.executeNew(ctx, &c, request{what: "new key", keys: []string{quote(key)}, body: r.o.Body})
	if !ok {
		return c
	}
	y := r.send(ctx, request{what: "same key, " + how, keys: []string{quote(key)}, body: variant})
	c.Details = append(describe(xs), y.String())
	switch {
	case y.err != nil:
		c.Status, c.Reason = Fail, "no response: "+y.err.Error()
	case y.ok() && bytes.Equal(y.body, first.body):
		c.Status, c.Reason = Fail, fmt.Sprintf("%d with the first request's body for another payload: the request is not fingerprinted", y.status)
	case y.ok():
		c.Status, c.Reason = Fail, fmt.Sprintf("%d with a new body: another payload under a used key was executed", y.status)
	case bytes.Equal(y.body, first.body):
		c.Status, c.Reason = Fail, fmt.Sprintf("%d, but with the first request's body", y.status)
	case y.status == http.StatusUnprocessableEntity:
		c.Status, c.Reason = Pass, "422 for a used key with another payload"
	default:
		c.Status, c.Reason = Warn, fmt.Sprintf("refused with %d; the draft specifies 422", y.status)
	}
	return c
}

// concurrentDuplicates: N simultaneous requests with one key execute
// once; the others get the same response as replays or 409 with
// Retry-After.
func (r *runner) concurrentDuplicates(ctx context.Context) Check {
	c := Check{Name: nameConcurrent}
	n := r.o.Concurrency
	q := request{what: "duplicate", keys: []string{quote(newKey())}, body: r.o.Body}
	xs := make([]*exchange, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range xs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			xs[i] = r.send(ctx, q)
		}()
	}
	close(start)
	wg.Wait()

	bodies := map[string]int{}
	counts := map[string]int{}
	executions, conflicts, markedFresh := 0, 0, 0
	var odd []string
	for _, x := range xs {
		counts[x.outcome()]++
		switch {
		case x.err != nil:
			odd = append(odd, "no response: "+x.err.Error())
		case x.ok():
			if bodies[string(x.body)] == 0 {
				executions++
			}
			bodies[string(x.body)]++
			if _, no := replayed(x); no {
				markedFresh++
			}
		case x.status == http.StatusConflict && x.header.Get("Retry-After") != "":
			conflicts++
		case x.status == http.StatusConflict:
			odd = append(odd, "409 without Retry-After")
		default:
			odd = append(odd, strconv.Itoa(x.status))
		}
	}
	for s, k := range counts {
		c.Details = append(c.Details, fmt.Sprintf("%d× %s", k, s))
	}
	slices.Sort(c.Details)
	executions = max(executions, markedFresh)
	if executions > 0 {
		r.mu.Lock()
		r.expected++ // the one execution a new key should cause
		r.mu.Unlock()
	}
	switch {
	case executions > 1:
		c.Status, c.Reason = Fail, fmt.Sprintf("%d simultaneous duplicates got %d distinct success responses (%d distinct bodies, %d marked as not replayed): executed more than once",
			n, executions, len(bodies), markedFresh)
	case executions == 0:
		c.Status, c.Reason = Fail, fmt.Sprintf("none of %d simultaneous duplicates succeeded", n)
	case len(odd) > 0:
		c.Status, c.Reason = Warn, fmt.Sprintf("one distinct response, but %d of %d duplicates got unexpected answers (%s)", len(odd), n, odd[0])
	default:
		c.Status, c.Reason = Pass, fmt.Sprintf("%d simultaneous duplicates: one distinct response, %d identical replays, %d× 409 with Retry-After",
			n, n-conflicts-1, conflicts)
	}
	return c
}

// tenantIsolation: two tenants using one key do not meet: each gets its
// own execution, and neither ever sees the other's response.
func (r *runner) tenantIsolation(ctx context.Context) Check {
	c := Check{Name: nameTenants}
	if len(r.o.SecondTenantHeaders) == 0 {
		c.Status, c.Reason = Skip, "no second tenant's headers given"
		return c
	}
	key := newKey()
	xs := r.execute(ctx, request{what: "tenant A", keys: []string{quote(key)}, body: r.o.Body})
	a := xs[len(xs)-1]
	if !a.ok() {
		c.Status, c.Reason, c.Details = Skip, fmt.Sprintf("tenant A's request failed (%s)", statusOf(a)), describe(xs)
		return c
	}
	r.executed(a)
	ys := r.execute(ctx, request{what: "tenant B, same key", keys: []string{quote(key)}, body: r.o.Body, tenant2: true})
	b := ys[len(ys)-1]
	c.Details = append(describe(xs), describe(ys)...)
	bReplay, bFresh := replayed(b)
	switch {
	case b.err != nil:
		c.Status, c.Reason = Fail, "tenant B: no response: "+b.err.Error()
		return c
	case b.status == http.StatusUnauthorized || b.status == http.StatusForbidden:
		c.Status, c.Reason = Skip, fmt.Sprintf("the second tenant's credentials were refused (%d)", b.status)
		return c
	case b.status == http.StatusConflict || b.status == http.StatusUnprocessableEntity:
		c.Status, c.Reason = Fail, fmt.Sprintf("tenant B was refused with %d because tenant A used the key: keys are shared between tenants", b.status)
		return c
	case !b.ok():
		c.Status, c.Reason = Warn, fmt.Sprintf("tenant B's request failed with %d", b.status)
		return c
	case bReplay:
		c.Status, c.Reason = Fail, "tenant B received tenant A's stored response (marked as a replay): keys are not scoped by tenant"
		return c
	case bytes.Equal(b.body, a.body) && !bFresh && r.bodiesAlike():
		c.Status, c.Reason = Warn, "inconclusive: tenant B got tenant A's body, but distinct executions return identical bodies and no replay marker"
		return c
	case bytes.Equal(b.body, a.body) && !bFresh:
		c.Status, c.Reason = Fail, "tenant B received tenant A's response: keys are not scoped by tenant"
		return c
	}
	r.executed(b)
	// Tenant B executed; tenant A's record must be untouched.
	zs := r.settle(ctx, request{what: "tenant A again", keys: []string{quote(key)}, body: r.o.Body})
	c.Details = append(c.Details, describe(zs)...)
	z := zs[len(zs)-1]
	switch {
	case z.ok() && bytes.Equal(z.body, a.body):
		c.Status, c.Reason = Pass, "two tenants with one key each got their own execution and replay"
	case z.ok() && bytes.Equal(z.body, b.body):
		c.Status, c.Reason = Fail, "tenant A's retry received tenant B's response"
	default:
		c.Status, c.Reason = r.judgeReplay(zs, a, "tenant A's retry")
		if c.Status == Pass {
			c.Reason = "two tenants with one key each got their own execution and replay"
		}
	}
	return c
}

// problemDetails: the error responses seen are RFC 9457 problem details.
func (r *runner) problemDetails() Check {
	c := Check{Name: nameProblem}
	r.mu.Lock()
	defer r.mu.Unlock()
	total := 0
	var other []string
	for _, x := range r.exchanges {
		if x.status < 400 {
			continue
		}
		total++
		ct := x.header.Get("Content-Type")
		mt, _, _ := mime.ParseMediaType(ct)
		switch {
		case mt != "application/problem+json":
			other = append(other, fmt.Sprintf("%d %s", x.status, orNone(ct)))
		case !isObject(x.body):
			other = append(other, fmt.Sprintf("%d application/problem+json, not a JSON object", x.status))
		}
	}
	switch {
	case total == 0:
		c.Status, c.Reason = Skip, "no error responses were seen"
	case len(other) > 0:
		c.Status, c.Reason = Warn, fmt.Sprintf("%d of %d error responses are not application/problem+json objects", len(other), total)
		c.Details = uniq(other)
	default:
		c.Status, c.Reason = Pass, fmt.Sprintf("all %d error responses are application/problem+json", total)
	}
	return c
}

// expiry: an advertised expiry (Idempotency-Key-Expires-At) is an RFC 3339
// time in the future.
func (r *runner) expiry() Check {
	c := Check{Name: nameExpiry}
	r.mu.Lock()
	defer r.mu.Unlock()
	var values []string
	for _, x := range r.exchanges {
		if v := x.header.Get("Idempotency-Key-Expires-At"); v != "" {
			values = append(values, v)
		}
	}
	if len(values) == 0 {
		c.Status, c.Reason = Skip, "no expiry advertised (Idempotency-Key-Expires-At); document how long keys are kept"
		return c
	}
	now := time.Now()
	var latest time.Time
	for _, v := range values {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			c.Status, c.Reason, c.Details = Fail, fmt.Sprintf("Idempotency-Key-Expires-At %q is not an RFC 3339 time", v), uniq(values)
			return c
		}
		if t.Before(now) {
			c.Status, c.Reason = Warn, fmt.Sprintf("Idempotency-Key-Expires-At %s is in the past", v)
			return c
		}
		latest = t
	}
	c.Status, c.Reason = Pass, fmt.Sprintf("%d responses advertise an expiry; records are kept about %s", len(values), latest.Sub(now).Round(time.Minute))
	return c
}

func statusOf(x *exchange) string {
	if x.err != nil {
		return "no response"
	}
	return strconv.Itoa(x.status)
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

func orNone(s string) string {
	if s == "" {
		return "(no Content-Type)"
	}
	return s
}

// uniq returns ss without repeats, in first-seen order.
func uniq(ss []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range ss {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

// member is one member of a JSON object, as it was written.
type member struct {
	name  string
	value json.RawMessage
}

// objectMembers returns the members of body if it is exactly one JSON
// object, in their order; the values keep their bytes (numbers stay as
// written).
func objectMembers(body []byte) ([]member, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, false
	}
	var ms []member
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, false
		}
		name, ok := t.(string)
		if !ok {
			return nil, false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, false
		}
		ms = append(ms, member{name, v})
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return ms, true
}

func isObject(b []byte) bool {
	_, ok := objectMembers(b)
	return ok
}

// encodeObject writes members as a JSON object, in reverse order if asked,
// compact or with whitespace around every member.
func encodeObject(ms []member, reverse, pretty bool) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i := range ms {
		m := ms[i]
		if reverse {
			m = ms[len(ms)-1-i]
		}
		if i > 0 {
			b.WriteByte(',')
		}
		if pretty {
			b.WriteString("\n  ")
		}
		name, _ := json.Marshal(m.name) // a string always encodes
		b.Write(name)
		if pretty {
			b.WriteString(" : ")
		} else {
			b.WriteByte(':')
		}
		b.Write(m.value)
	}
	if pretty {
		b.WriteString("\n")
	}
	b.WriteString("}")
	if pretty {
		b.WriteString("\n")
	}
	return b.Bytes()
}

// reorderJSON returns body, a JSON object, with its members in reverse
// order and whitespace added: the same JSON value in other bytes.
func reorderJSON(body []byte) ([]byte, bool) {
	ms, ok := objectMembers(body)
	if !ok {
		return nil, false
	}
	return encodeObject(ms, true, true), true
}

// deriveVariant returns a payload that differs from body, a JSON object, in
// value: its first integer member plus one (amounts are what fingerprints
// most surely cover), else its first boolean negated, else its first string
// member with "-variant" appended, else with a member added. how describes
// the change.
func deriveVariant(body []byte) (variant []byte, how string, ok bool) {
	ms, ok := objectMembers(body)
	if !ok {
		return nil, "", false
	}
	changes := []func(v json.RawMessage) (string, bool){
		func(v json.RawMessage) (string, bool) {
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || n == math.MaxInt64 {
				return "", false
			}
			return strconv.FormatInt(n+1, 10), true
		},
		func(v json.RawMessage) (string, bool) {
			s := string(v)
			return strconv.FormatBool(s == "false"), s == "true" || s == "false"
		},
		func(v json.RawMessage) (string, bool) {
			var s string
			if len(v) == 0 || v[0] != '"' || json.Unmarshal(v, &s) != nil {
				return "", false
			}
			b, err := json.Marshal(s + "-variant")
			return string(b), err == nil
		},
	}
	for _, change := range changes {
		for i, m := range ms {
			if nv, ok := change(m.value); ok {
				ms[i].value = json.RawMessage(nv)
				return encodeObject(ms, false, false), fmt.Sprintf("%q changed from %s to %s", m.name, m.value, nv), true
			}
		}
	}
	ms = append(ms, member{"idem_check_variant", json.RawMessage("true")})
	return encodeObject(ms, false, false), `member "idem_check_variant" added`, true
}
