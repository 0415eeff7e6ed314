package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/textproto"
	"os"
	"strings"
	"time"

	"github.com/idemhq/idem/cmd/idem/internal/check"
)

const checkAbout = `Grades an HTTP endpoint that claims to implement the Idempotency-Key
pattern, over real HTTP: missing and malformed keys, first execution, exact
replay, quoted and bare keys, reordered JSON, a reused key with another
payload, simultaneous duplicates, tenant isolation, problem+json errors and
expiry information. Responses alone show what was answered ("one distinct
response"), not how often the operation ran: --count-url verifies that.
Each check prints PASS, FAIL, WARN or SKIP with a reason.
Exit status: 0 when nothing failed, 1 on any FAIL, 2 when the endpoint could
not be checked.

The checks run the operation for real, several times: point it at a test
environment.

Example:
  idem check --body '{"amountCents":100,"currency":"USD","reference":"t"}' \
    --header 'Authorization: Bearer a' --second-tenant-header 'Authorization: Bearer b' \
    --count-url http://127.0.0.1:8080/api/payments/count http://127.0.0.1:8080/api/payments`

func runCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newFlags("check", checkAbout, stdout, stderr)
	method := f.String("method", check.DefaultMethod, "request method")
	body := f.String("body", "", "request body sent by every check (@file reads a file)")
	variant := f.String("variant", "", "a different body, sent with a used key (expects 422); default:\nthe body with its first member changed (@file reads a file)")
	var headers, second multiFlag
	f.Var(&headers, "header", "a request header field, \"Name: value\" (repeatable)")
	f.Var(&second, "second-tenant-header", "a header field that makes requests as a second tenant, replacing\nthe --header of the same name (repeatable); enables the tenant check")
	concurrency := f.Int("concurrency", 20, "simultaneous duplicates sent by the concurrency check")
	timeout := f.Duration("timeout", 10*time.Second, "bound on each request")
	countURL := f.String("count-url", "", "a URL answering GET with {\"count\":N}, the number of times the\noperation ran (the demo's /api/payments/count): each check then\nverifies executions, not only responses (a new key +1, replays and\nrefused requests +0; anything else is a FAIL)")
	asJSON := f.Bool("json", false, "print the report as JSON")
	if code, ok := f.parse(args); !ok {
		return code
	}
	pos := f.positional()
	if len(pos) != 1 {
		return f.usageError("give exactly one URL to check")
	}
	o := check.Options{URL: pos[0], Method: strings.ToUpper(*method), Concurrency: *concurrency, Timeout: *timeout, CountURL: *countURL}
	var err error
	if o.Body, err = readArg(*body); err != nil {
		return f.usageError("--body: %v", err)
	}
	if o.Variant, err = readArg(*variant); err != nil {
		return f.usageError("--variant: %v", err)
	}
	if o.Headers, err = parseHeaders(headers); err != nil {
		return f.usageError("--header: %v", err)
	}
	if len(second) > 0 {
		if o.SecondTenantHeaders, err = parseHeaders(second); err != nil {
			return f.usageError("--second-tenant-header: %v", err)
		}
	}
	report, err := check.Run(ctx, o)
	if report != nil {
		if *asJSON {
			if werr := report.WriteJSON(stdout); werr != nil {
				fmt.Fprintf(stderr, "idem check: %v\n", werr)
				return exitUsage
			}
		} else {
			report.WriteText(stdout)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "idem check: %v\n", err)
		return exitUsage
	}
	if report.Failed() {
		return exitError
	}
	return exitOK
}

// readArg returns a flag's text, or the contents of the file it names with
// a leading @.
func readArg(v string) ([]byte, error) {
	if name, ok := strings.CutPrefix(v, "@"); ok {
		return os.ReadFile(name)
	}
	if v == "" {
		return nil, nil
	}
	return []byte(v), nil
}

// parseHeaders parses "Name: value" fields.
func parseHeaders(fields []string) (http.Header, error) {
	h := http.Header{}
	for _, fl := range fields {
		name, value, ok := strings.Cut(fl, ":")
		name = strings.TrimSpace(name)
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("%q is not \"Name: value\"", fl)
		}
		h.Add(textproto.CanonicalMIMEHeaderKey(name), strings.TrimSpace(value))
	}
	return h, nil
}
