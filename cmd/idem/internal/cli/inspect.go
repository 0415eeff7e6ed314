package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
)

// The operator commands: idem inspect, idem ls and idem delete. They work
// on every store that outlives a process (a SQLite file, postgres://,
// redis://) through the idem.Inspector capability.

const inspectAbout = `Shows the idempotency record for KEY: its state, lease, expiry, fingerprint
version and sizes, and the steps of an in-flight record's recovery point. The
stored response's header fields and body, and the data of the steps, are
shown only with --show-body (they may hold personal data). Without --scope,
every scope holding KEY is shown (Redis keeps keys only hashed and needs
--scope; idem ls prints the scopes). A response or recovery point stored
encrypted (idem serve|proxy --encryption-keys) is shown only with the same
--encryption-keys. Exit status 1 when there is no such record.`

const lsAbout = `Lists unexpired idempotency records, sorted by scope and key (Redis: in its
own order, and by Redis key name, since it keeps scopes and keys only hashed).
STATE "held" is an in-flight record held for an operator: reconciliation gave
up on it (idem serve --reconcile-max-attempts, --reconcile-max-age); a retry
with its key still resumes it.`

const deleteAbout = `Deletes the idempotency record for KEY, so that the key is new again: a retry
executes the operation once more. It refuses an in-flight record (the first
attempt may still be running) unless --force is given. Without --scope, KEY
must be held by exactly one scope.`

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newFlags("inspect", inspectAbout, stdout, stderr)
	store := storeFlag(f)
	scope := f.String("scope", "", "the record's scope, as idem ls prints it (default: every scope\nholding KEY)")
	showBody := f.Bool("show-body", false, "also print the stored response's header fields and body")
	asJSON := f.Bool("json", false, "print JSON instead of text")
	encKeys := f.encryptionFlag()
	if code, ok := f.parse(args); !ok {
		return code
	}
	key, code := oneKey(f)
	if code != exitOK {
		return code
	}
	enc, _, err := loadEncryption(*encKeys, nil, func(msg string) { fmt.Fprintf(stderr, "idem inspect: warning: %s\n", msg) })
	if err != nil {
		fmt.Fprintf(stderr, "idem inspect: --encryption-keys: %v\n", err)
		return exitError
	}
	in, s, err := openInspector(ctx, *store)
	if err != nil {
		fmt.Fprintf(stderr, "idem inspect: %v\n", err)
		return exitError
	}
	defer s.Close()
	recs, err := lookup(ctx, in, *scope, key)
	if err != nil {
		fmt.Fprintf(stderr, "idem inspect: %v\n", err)
		return exitError
	}
	if len(recs) == 0 {
		fmt.Fprintf(stderr, "idem inspect: no record for this key in %s\n", s.Where)
		return exitError
	}
	notes := openResponses(ctx, enc, recs)
	openCheckpoints(ctx, enc, recs, notes)
	if *asJSON {
		out := make([]recordJSON, len(recs))
		for i, r := range recs {
			out[i] = toJSON(r, *showBody)
			out[i].Encryption = notes[i]
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		return exitOK
	}
	for i, r := range recs {
		if i > 0 {
			fmt.Fprintln(stdout)
		}
		printRecord(stdout, r, *showBody, notes[i])
	}
	return exitOK
}

// openResponses decrypts the records' stored responses with enc (nil when
// no --encryption-keys was given) and returns, per record, what to say
// about its encryption: "" for a response stored in clear. A response it
// cannot decrypt is dropped from its record, so that ciphertext is never
// printed as a body.
func openResponses(ctx context.Context, enc *idem.Encryption, recs []idem.RecordInfo) []string {
	notes := make([]string, len(recs))
	for i := range recs {
		r := &recs[i]
		if r.Response == nil {
			continue
		}
		var none *idem.Encryption // opens exactly the responses stored in clear
		if _, err := none.Open(ctx, r.Scope, r.Key, r.Response); err == nil {
			continue
		}
		if enc == nil {
			notes[i], r.Response = "encrypted; give --encryption-keys to read the response", nil
			continue
		}
		resp, err := enc.Open(ctx, r.Scope, r.Key, r.Response)
		if err != nil {
			notes[i], r.Response = "encrypted and unreadable with these keys: "+err.Error(), nil
			continue
		}
		notes[i], r.Response = "encrypted; decrypted with --encryption-keys", resp
	}
	return notes
}

func runLs(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newFlags("ls", lsAbout, stdout, stderr)
	store := storeFlag(f)
	state := f.String("state", "", "only records in this state: in-flight or completed")
	limit := f.Int("limit", 100, "list at most this many records")
	asJSON := f.Bool("json", false, "print JSON instead of a table")
	if code, ok := f.parse(args); !ok {
		return code
	}
	if len(f.positional()) > 0 {
		return f.usageError("unexpected argument %q", f.positional()[0])
	}
	p := idem.ListParams{Limit: *limit, Now: time.Now()}
	switch *state {
	case "":
	case "in-flight":
		p.State = idem.StateInFlight
	case "completed":
		p.State = idem.StateCompleted
	default:
		return f.usageError("--state must be in-flight or completed, not %q", *state)
	}
	if *limit <= 0 {
		return f.usageError("--limit must be positive")
	}
	in, s, err := openInspector(ctx, *store)
	if err != nil {
		fmt.Fprintf(stderr, "idem ls: %v\n", err)
		return exitError
	}
	defer s.Close()
	recs, err := in.List(ctx, p)
	if err != nil {
		fmt.Fprintf(stderr, "idem ls: %v\n", err)
		return exitError
	}
	if *asJSON {
		out := make([]recordJSON, len(recs))
		for i, r := range recs {
			out[i] = toJSON(r, false)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(out)
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STATE\tEXPIRES AT\tLEASE UNTIL\tSIZE\tSCOPE\tKEY")
	for _, r := range recs {
		state, lease := r.State.String(), "-"
		switch {
		case r.Held():
			state = "held"
		case r.State == idem.StateInFlight:
			lease = r.LeaseExpiresAt.Format(time.RFC3339)
		}
		scope, key := quoteField(r.Scope), quoteField(r.Key)
		if r.Scope == "" && r.Key == "" {
			scope, key = "(hashed)", r.ID
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", state, r.ExpiresAt.Format(time.RFC3339), lease, r.ResponseSize, scope, key)
	}
	_ = tw.Flush()
	return exitOK
}

func runDelete(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newFlags("delete", deleteAbout, stdout, stderr)
	store := storeFlag(f)
	scope := f.String("scope", "", "the record's scope, as idem ls prints it (default: the one\nscope holding KEY)")
	force := f.Bool("force", false, "delete an in-flight record too")
	if code, ok := f.parse(args); !ok {
		return code
	}
	key, code := oneKey(f)
	if code != exitOK {
		return code
	}
	in, s, err := openInspector(ctx, *store)
	if err != nil {
		fmt.Fprintf(stderr, "idem delete: %v\n", err)
		return exitError
	}
	defer s.Close()
	sc := *scope
	if sc == "" {
		recs, err := lookup(ctx, in, "", key)
		if err != nil {
			fmt.Fprintf(stderr, "idem delete: %v\n", err)
			return exitError
		}
		switch len(recs) {
		case 0:
			fmt.Fprintf(stderr, "idem delete: no record for this key in %s\n", s.Where)
			return exitError
		case 1:
			sc = recs[0].Scope
		default:
			fmt.Fprintf(stderr, "idem delete: %d scopes hold this key; choose one with --scope (see idem inspect)\n", len(recs))
			return exitError
		}
	}
	err = in.Delete(ctx, idem.DeleteParams{Scope: sc, Key: key, Force: *force, Now: time.Now()})
	switch {
	case errors.Is(err, idem.ErrNotFound):
		fmt.Fprintf(stderr, "idem delete: no record for this key in scope %s\n", quoteField(sc))
		return exitError
	case errors.Is(err, idem.ErrInFlight):
		fmt.Fprintln(stderr, "idem delete: the record is in flight (its first attempt may still be running); refusing without --force")
		return exitError
	case err != nil:
		fmt.Fprintf(stderr, "idem delete: %v\n", err)
		return exitError
	}
	fmt.Fprintf(stdout, "deleted the record in scope %s from %s\n", quoteField(sc), s.Where)
	return exitOK
}

func storeFlag(f *flags) *string {
	return f.String("store", "idem.db", "the records store: a SQLite file path, a postgres:// URL or a redis:// URL")
}

// oneKey returns the one positional argument, KEY.
func oneKey(f *flags) (string, int) {
	switch args := f.positional(); {
	case len(args) == 0:
		return "", f.usageError("KEY is missing")
	case len(args) > 1:
		return "", f.usageError("one KEY expected, got %d arguments", len(args))
	case args[0] == "":
		return "", f.usageError("KEY is empty")
	default:
		return args[0], exitOK
	}
}

// openInspector opens the store named by spec, which must outlive this
// process and implement idem.Inspector.
func openInspector(ctx context.Context, spec string) (idem.Inspector, *backend.Store, error) {
	kind, err := backend.KindOf(spec)
	if err != nil {
		return nil, nil, err
	}
	switch kind {
	case backend.Memory:
		return nil, nil, errors.New(`"memory" lives inside one process; point --store at a SQLite file, postgres:// or redis://`)
	case backend.SQLite:
		// Opening a missing path would create an empty database.
		if _, err := os.Stat(spec); err != nil {
			return nil, nil, fmt.Errorf("SQLite store: %w", err)
		}
	}
	s, err := backend.Open(ctx, spec)
	if err != nil {
		return nil, nil, err
	}
	in, ok := s.Records.(idem.Inspector)
	if !ok {
		s.Close()
		return nil, nil, fmt.Errorf("%s cannot be inspected", s.Where)
	}
	return in, s, nil
}

// lookup returns the record for key in scope, or in every scope when scope
// is empty.
func lookup(ctx context.Context, in idem.Inspector, scope, key string) ([]idem.RecordInfo, error) {
	now := time.Now()
	if scope != "" {
		r, err := in.Get(ctx, idem.GetParams{Scope: scope, Key: key, Now: now})
		if errors.Is(err, idem.ErrNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return []idem.RecordInfo{r}, nil
	}
	found, err := in.List(ctx, idem.ListParams{Key: key, Limit: 100, Now: now})
	if err != nil {
		return nil, err
	}
	var out []idem.RecordInfo
	for _, f := range found {
		r, err := in.Get(ctx, idem.GetParams{Scope: f.Scope, Key: f.Key, Now: now})
		if errors.Is(err, idem.ErrNotFound) {
			continue // gone since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// quoteField quotes a scope or key for a terminal if it holds anything
// but printable text.
func quoteField(s string) string {
	if strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f || r == ' ' || r == '\t' }) {
		return fmt.Sprintf("%q", s)
	}
	return s
}

func printRecord(w io.Writer, r idem.RecordInfo, showBody bool, encryption string) {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	line := func(k, format string, args ...any) {
		fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{k}, args...)...)
	}
	line("scope", "%s", quoteField(r.Scope))
	line("key", "%s", quoteField(r.Key))
	if r.ID != "" {
		line("store id", "%s", r.ID)
	}
	if r.Held() {
		line("state", "%s, held for an operator: reconciliation gave up on it; a retry with its key still resumes it", r.State)
	} else {
		line("state", "%s", r.State)
	}
	line("fingerprint", "%s", r.Fingerprint)
	line("fingerprint version", "%s", r.FingerprintVersion())
	line("expires at", "%s (in %s)", r.ExpiresAt.Format(time.RFC3339Nano), time.Until(r.ExpiresAt).Round(time.Second))
	if r.State == idem.StateInFlight && !r.Held() {
		line("lease until", "%s (%s)", r.LeaseExpiresAt.Format(time.RFC3339Nano), leaseState(r.LeaseExpiresAt))
	}
	if encryption != "" {
		line("encryption", "%s", encryption)
	}
	printSteps(line, r)
	if resp := r.Response; resp != nil {
		line("response status", "%d", resp.StatusCode)
		line("response size", "%d bytes stored (body %d bytes, %d header fields)", r.ResponseSize, len(resp.Body), len(resp.Header))
		if resp.Unreplayable {
			line("replayable", "no (the body was too large or streamed; retries get 409 idempotency.response_unavailable)")
		}
	}
	_ = tw.Flush()
	if showBody && r.Response != nil {
		fmt.Fprintln(w)
		names := slices.Sorted(func(yield func(string) bool) {
			for k := range r.Response.Header {
				if !yield(k) {
					return
				}
			}
		})
		for _, k := range names {
			for _, v := range r.Response.Header[k] {
				fmt.Fprintf(w, "%s: %s\n", k, v)
			}
		}
		fmt.Fprintln(w)
		_, _ = w.Write(r.Response.Body)
		if n := len(r.Response.Body); n > 0 && r.Response.Body[n-1] != '\n' {
			fmt.Fprintln(w)
		}
	}
	if showBody {
		printStepData(w, r)
	}
}

func leaseState(t time.Time) string {
	if d := time.Until(t); d > 0 {
		return "live for " + d.Round(time.Millisecond).String()
	}
	return "expired: the next retry takes the record over"
}

// recordJSON is the --json form of a record.
type recordJSON struct {
	Scope              string              `json:"scope,omitempty"`
	Key                string              `json:"key,omitempty"`
	ID                 string              `json:"id,omitempty"`
	State              string              `json:"state"`
	Fingerprint        string              `json:"fingerprint"`
	FingerprintVersion string              `json:"fingerprintVersion"`
	ExpiresAt          time.Time           `json:"expiresAt"`
	LeaseExpiresAt     *time.Time          `json:"leaseExpiresAt,omitempty"`
	Held               bool                `json:"held,omitempty"`
	ResponseSize       int                 `json:"responseSize"`
	Status             int                 `json:"status,omitempty"`
	BodySize           *int                `json:"bodySize,omitempty"`
	Unreplayable       bool                `json:"unreplayable,omitempty"`
	Header             map[string][]string `json:"header,omitempty"`
	Body               *string             `json:"body,omitempty"`
	// Encryption says whether the stored response (or recovery point) is
	// encrypted and whether --encryption-keys decrypted it; absent for one
	// stored in clear.
	Encryption string `json:"encryption,omitempty"`
	// Steps are the steps of an in-flight record's recovery point (with
	// their data under --show-body).
	Steps []stepJSON `json:"steps,omitempty"`
}

func toJSON(r idem.RecordInfo, showBody bool) recordJSON {
	j := recordJSON{Scope: r.Scope, Key: r.Key, ID: r.ID, State: r.State.String(), Fingerprint: r.Fingerprint,
		FingerprintVersion: r.FingerprintVersion(), ExpiresAt: r.ExpiresAt, ResponseSize: r.ResponseSize}
	switch {
	case r.Held():
		j.Held = true
	case r.State == idem.StateInFlight:
		j.LeaseExpiresAt = &r.LeaseExpiresAt
		j.Steps = stepsJSON(r, showBody)
	}
	if resp := r.Response; resp != nil {
		n := len(resp.Body)
		j.Status, j.BodySize, j.Unreplayable = resp.StatusCode, &n, resp.Unreplayable
		if showBody {
			body := string(resp.Body)
			j.Header, j.Body = resp.Header, &body
		}
	}
	return j
}
