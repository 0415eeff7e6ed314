package idem

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Problem codes: the stable "code" member of every problem+json body idem
// writes. Clients may switch on them; they never change meaning.
const (
	CodeKeyMissing          = "idempotency.key_missing"          // 400
	CodeKeyInvalid          = "idempotency.key_invalid"          // 400
	CodeBodyInvalid         = "idempotency.body_invalid"         // 400
	CodeScopeInvalid        = "idempotency.scope_invalid"        // 400
	CodeRequestTooLarge     = "idempotency.request_too_large"    // 413
	CodeRequestInProgress   = "idempotency.request_in_progress"  // 409 + Retry-After
	CodeKeyReused           = "idempotency.key_reused"           // 422
	CodeResponseUnavailable = "idempotency.response_unavailable" // 409, no Retry-After
	CodeStoreUnavailable    = "idempotency.store_unavailable"    // 503 + Retry-After
	CodeLeaseLost           = "idempotency.lease_lost"           // 503 + Retry-After
	CodeRecordUnreadable    = "idempotency.record_unreadable"    // 503 + Retry-After
)

// DefaultProblemBaseURL is the default of Config.ProblemBaseURL: the table
// of problem codes in docs/semantics.md, where each code has an anchor of
// its own name.
const DefaultProblemBaseURL = "https://github.com/idemhq/idem/blob/main/docs/semantics.md#"

// problemTypeBase prefixes the code to form the "type" URI of a problem
// that has none.
const problemTypeBase = DefaultProblemBaseURL

// Problem is an RFC 9457 problem detail. It is also an error, so that
// application hooks (FingerprintFunc, TenantFunc) can return a complete
// response, such as a validation failure that lists each invalid field.
type Problem struct {
	// Type is a URI naming the problem type. Defaults to
	// https://github.com/idemhq/idem/blob/main/docs/semantics.md# followed
	// by Code: each code is documented under its own anchor there.
	Type string
	// Title is a short, human-readable summary of the problem type.
	Title string
	// Status is the HTTP status code.
	Status int
	// Detail explains this occurrence.
	Detail string
	// Code is idem's stable machine-readable code (see the Code constants).
	Code string
	// RetryAfter, when positive, is sent as the Retry-After field in
	// seconds.
	RetryAfter int
	// Extensions are further members of the JSON object (for example
	// "errors" for validation failures). They cannot replace the standard
	// members.
	Extensions map[string]any
}

func (p *Problem) Error() string {
	if p.Detail != "" {
		return p.Code + ": " + p.Detail
	}
	return p.Code + ": " + p.Title
}

// MarshalJSON writes the standard members first, in the order RFC 9457
// lists them, then code, then the extensions in sorted order.
func (p *Problem) MarshalJSON() ([]byte, error) {
	typ := p.Type
	if typ == "" && p.Code != "" {
		typ = problemTypeBase + p.Code
	}
	var b bytes.Buffer
	b.WriteByte('{')
	member := func(name string, v any) error {
		if b.Len() > 1 {
			b.WriteByte(',')
		}
		enc, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("idem: problem member %q: %w", name, err)
		}
		k, _ := json.Marshal(name)
		b.Write(k)
		b.WriteByte(':')
		b.Write(enc)
		return nil
	}
	if typ != "" {
		member("type", typ)
	}
	member("title", p.Title)
	member("status", p.Status)
	if p.Detail != "" {
		member("detail", p.Detail)
	}
	if p.Code != "" {
		member("code", p.Code)
	}
	for _, k := range slices.Sorted(maps.Keys(p.Extensions)) {
		switch k {
		case "type", "title", "status", "detail", "code":
			continue // the standard members cannot be replaced
		}
		if err := member(k, p.Extensions[k]); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// WriteProblem writes p as application/problem+json with its status (and
// Retry-After, if set). When p's type is an http or https URI, a Link
// field points to it with rel="describedby" (RFC 8288), as the
// Idempotency-Key draft recommends, so that clients that never parse the
// body still find the documentation. Headers already set on w are kept.
func WriteProblem(w http.ResponseWriter, p *Problem) {
	body, err := p.MarshalJSON()
	if err != nil {
		// Only an unencodable extension can fail; drop the extensions.
		q := *p
		q.Extensions = nil
		body, _ = q.MarshalJSON()
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Del("Content-Encoding")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.RetryAfter))
	}
	typ := p.Type
	if typ == "" && p.Code != "" {
		typ = problemTypeBase + p.Code
	}
	if strings.HasPrefix(typ, "https://") || strings.HasPrefix(typ, "http://") {
		if !strings.ContainsAny(typ, "<>\r\n") {
			h.Add("Link", "<"+typ+">; rel=\"describedby\"")
		}
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(append(body, '\n'))
}

func newProblem(status int, code, title, detail string) *Problem {
	return &Problem{Status: status, Code: code, Title: title, Detail: detail}
}
