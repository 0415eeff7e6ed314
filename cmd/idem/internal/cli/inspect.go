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
	"time"

	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/idemcrypt"
	"github.com/idemhq/idem/idemstore"
)

// The operator commands: idem inspect, idem ls and idem delete. They work
// on every store that outlives a process (a SQLite file, postgres://,
// redis://) through the idemstore.Inspector capability. Everything they print
// from a record is escaped for the terminal (escape.go).

// scopeHelp says what a scope is and how the commands take one back.
const scopeHelp = `A scope is LEN:TENANT|OPERATION: the tenant's length in bytes, a colon, the
tenant, a bar and the operation (the route pattern such as "POST /payments",
or the full gRPC method); with no tenant, 0:|POST /payments. idem ls prints
it; --scope and KEY take what it prints, quoted form included ("..." with Go
escapes, used for anything with a space or a character that is not
printable).`

const inspectAbout = `Shows the idempotency record for KEY: its state, lease, expiry, fingerprint
version and sizes, and the steps of an in-flight record's recovery point. The
stored response's header fields and body, and the data of the steps, are shown
only with --show-body (they may hold personal data), with control characters
escaped (\x1b, \u009b); --json gives the body exactly (bodyEncoding "utf-8",
or "base64" for a body that is not UTF-8 text). Without --scope, every scope
holding KEY is shown. Redis keeps scopes and keys only hashed: there, give
--scope with KEY, or instead of KEY the record's ID as idem ls prints it
(PREFIX{64 hex digits}). A response or recovery point stored encrypted (idem
serve|proxy --encryption-keys) is shown only with the same --encryption-keys. Exit status
1 when there is no such record.

` + scopeHelp

const lsAbout = `Lists unexpired idempotency records, sorted by scope and key (Redis: in its
own order, and by record ID, since it keeps scopes and keys only hashed). It
reads the store a page at a time and prints as it goes, so its memory does not
grow with --limit. When more records may follow the last one printed, it ends
with a cursor (on stderr, or as "next" in --json) that --after takes to go on
from there. On Redis a record may be listed twice when Redis resizes its key
table during a long listing. STATE "held" is an in-flight record held for an
operator: reconciliation gave up on it (idem serve --reconcile-max-attempts,
--reconcile-max-age); a retry with its key still resumes it.

` + scopeHelp

const deleteAbout = `Deletes the idempotency record for KEY, so that the key is new again: a retry
executes the operation once more. It refuses an in-flight record (the first
attempt may still be running) unless --force is given. Without --scope, KEY
must be held by exactly one scope. On Redis, give --scope with KEY, or instead
of KEY the record's ID as idem ls prints it.

` + scopeHelp

// lsPage is how many records idem ls asks the store for at once: its
// memory is about one page of records, whatever --limit is.
const lsPage = 1000

// lookupMax bounds how many scopes idem inspect shows for one key.
const lookupMax = 100

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
	name, code := recordName(f, *store, *scope)
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
	recs, more, err := lookup(ctx, in, name)
	if err != nil {
		fmt.Fprintf(stderr, "idem inspect: %s\n", storeError(err, s))
		return exitError
	}
	if len(recs) == 0 {
		fmt.Fprintf(stderr, "idem inspect: no record for this %s in %s\n", name.what(), s.Where)
		return exitError
	}
	if more {
		fmt.Fprintf(stderr, "idem inspect: more than %d scopes hold this key; the first %d are shown (choose one with --scope)\n", lookupMax, lookupMax)
	}
	notes := openResponses(ctx, enc, recs)
	openCheckpoints(ctx, enc, recs, notes)
	if *asJSON {
		out := make([]recordJSON, len(recs))
		for i, r := range recs {
			out[i] = toJSON(r, *showBody)
			out[i].Encryption = notes[i]
		}
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			fmt.Fprintf(stderr, "idem inspect: %v\n", err)
			return exitError
		}
		_, _ = stdout.Write(append(escapeJSON(b), '\n'))
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
func openResponses(ctx context.Context, enc *idemcrypt.Encryption, recs []idemstore.RecordInfo) []string {
	notes := make([]string, len(recs))
	for i := range recs {
		r := &recs[i]
		if r.Response == nil {
			continue
		}
		var none *idemcrypt.Encryption // opens exactly the responses stored in clear
		if _, err := none.Open(ctx, r.Scope, r.Key, r.Response); err == nil {
			continue
		}
		switch {
		case enc == nil:
			notes[i], r.Response = "encrypted; give --encryption-keys to read the response", nil
			continue
		case r.Scope == "" && r.Key == "":
			// Found by its ID: a sealed response is bound to the scope and
			// key, which the store keeps only hashed.
			notes[i], r.Response = "encrypted; give --scope and KEY instead of the ID to decrypt the response", nil
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
	limit := f.Int("limit", 100, "list at most this many records (any number: they are read and\nprinted a page at a time)")
	after := f.String("after", "", "go on after the records an earlier idem ls printed: the cursor it\nended with")
	asJSON := f.Bool("json", false, `print JSON instead of a table: {"records": [...], "next": CURSOR}`)
	if code, ok := f.parse(args); !ok {
		return code
	}
	if len(f.positional()) > 0 {
		return f.usageError("unexpected argument %q", f.positional()[0])
	}
	p := idemstore.ListParams{After: *after, Now: time.Now()}
	switch *state {
	case "":
	case "in-flight":
		p.State = idemstore.StateInFlight
	case "completed":
		p.State = idemstore.StateCompleted
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

	var w recordWriter = newTableWriter(stdout, hashedNames(s.Kind))
	if *asJSON {
		w = newJSONWriter(stdout)
	}
	for left := *limit; left > 0; {
		p.Limit = min(left, lsPage)
		page, err := in.List(ctx, p)
		if err != nil {
			fmt.Fprintf(stderr, "idem ls: %s\n", lsError(err, s, *after, p.After))
			return exitError
		}
		if err := w.write(page.Records); err != nil {
			fmt.Fprintf(stderr, "idem ls: writing the listing: %v\n", err)
			return exitError
		}
		left -= len(page.Records)
		if p.After = page.Next; p.After == "" {
			break
		}
	}
	if err := w.end(p.After); err != nil {
		fmt.Fprintf(stderr, "idem ls: writing the listing: %v\n", err)
		return exitError
	}
	if p.After != "" && !*asJSON {
		fmt.Fprintf(stderr, "idem ls: more records may follow; go on with --after %s\n", p.After)
	}
	return exitOK
}

// lsError explains a failed page of idem ls, with where to go on from when
// some pages were printed.
func lsError(err error, s *backend.Store, first, at string) string {
	if errors.Is(err, idemstore.ErrInvalidCursor) && at == first {
		return fmt.Sprintf("--after: not a cursor idem ls printed for %s, or one it can no longer go on from: %s", s.Where, reason(err, idemstore.ErrInvalidCursor))
	}
	msg := storeError(err, s)
	if at != "" && at != first {
		msg += "; the records before were printed: go on with --after " + at
	}
	return msg
}

// storeError is err as an operator reads it: the idem errors an operator
// command can meet say what to do on the command line.
func storeError(err error, s *backend.Store) string {
	switch {
	case errors.Is(err, idemstore.ErrKeySearchUnsupported):
		return "Redis keeps scopes and keys only hashed, so a key cannot be found without its scope: give --scope SCOPE with KEY, or instead of KEY the record's ID as idem ls prints it"
	case errors.Is(err, idemstore.ErrInvalidID):
		return fmt.Sprintf("not a record ID of %s (%s). Redis keeps scopes and keys only hashed: give --scope SCOPE with KEY, or instead of KEY the record's ID as idem ls prints it in its ID column", s.Where, reason(err, idemstore.ErrInvalidID))
	}
	return err.Error()
}

// reason returns what err says after sentinel, the idem error it wraps: the
// store's explanation without the names of the functions it passed through.
func reason(err, sentinel error) string {
	msg := err.Error()
	if _, after, ok := strings.Cut(msg, sentinel.Error()+": "); ok {
		return after
	}
	return strings.TrimPrefix(sentinel.Error(), "idem: ")
}

// hashedNames reports whether a backend keeps scopes and keys only hashed,
// so that records are known by their ID.
func hashedNames(k backend.Kind) bool { return k == backend.Redis || k == backend.RedisCluster }

func runDelete(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newFlags("delete", deleteAbout, stdout, stderr)
	store := storeFlag(f)
	scope := f.String("scope", "", "the record's scope, as idem ls prints it (default: the one\nscope holding KEY)")
	force := f.Bool("force", false, "delete an in-flight record too")
	if code, ok := f.parse(args); !ok {
		return code
	}
	name, code := recordName(f, *store, *scope)
	if code != exitOK {
		return code
	}
	in, s, err := openInspector(ctx, *store)
	if err != nil {
		fmt.Fprintf(stderr, "idem delete: %v\n", err)
		return exitError
	}
	defer s.Close()
	if name.id == "" && !name.scoped {
		recs, _, err := lookup(ctx, in, name)
		if err != nil {
			fmt.Fprintf(stderr, "idem delete: %s\n", storeError(err, s))
			return exitError
		}
		switch len(recs) {
		case 0:
			fmt.Fprintf(stderr, "idem delete: no record for this key in %s\n", s.Where)
			return exitError
		case 1:
			name.scope, name.scoped = recs[0].Scope, true
		default:
			fmt.Fprintf(stderr, "idem delete: %d scopes hold this key; choose one with --scope (see idem inspect)\n", len(recs))
			return exitError
		}
	}
	err = in.Delete(ctx, idemstore.DeleteParams{Scope: name.scope, Key: name.key, ID: name.id, Force: *force, Now: time.Now()})
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		fmt.Fprintf(stderr, "idem delete: no record for this %s in %s\n", name.what(), s.Where)
		return exitError
	case errors.Is(err, idemstore.ErrInFlight):
		fmt.Fprintln(stderr, "idem delete: the record is in flight (its first attempt may still be running); refusing without --force")
		return exitError
	case err != nil:
		fmt.Fprintf(stderr, "idem delete: %s\n", storeError(err, s))
		return exitError
	}
	fmt.Fprintf(stdout, "deleted the record %s from %s\n", name.describe(), s.Where)
	return exitOK
}

func storeFlag(f *flags) *string {
	return f.String("store", "idem.db", "the records store: a SQLite file path, a postgres://, mysql:// or redis:// URL")
}

// name is the record an idem inspect or idem delete command names: by
// scope (when scoped) and key, or, on a store that keeps them only hashed,
// by ID.
type name struct {
	scope, key, id string
	scoped         bool
}

// what names the kind of argument for messages, which never repeat a key.
func (n name) what() string {
	if n.id != "" {
		return "ID"
	}
	if n.scoped {
		return "key in scope " + termField(n.scope)
	}
	return "key"
}

// describe names the record for the message of a deletion: its scope or
// its ID, never its key.
func (n name) describe() string {
	if n.id != "" {
		return termField(n.id)
	}
	return "in scope " + termField(n.scope)
}

// recordName reads the one positional argument: KEY, with --scope if
// given; or, on a store whose records are known by ID, with no --scope,
// the record's ID. The ID's form is the store's to check; here the
// argument counts as an ID only when --store is a Redis URL and no
// --scope is given, since such a store cannot find a key without its
// scope.
func recordName(f *flags, store, scope string) (name, int) {
	args := f.positional()
	switch {
	case len(args) == 0:
		return name{}, f.usageError("KEY is missing")
	case len(args) > 1:
		return name{}, f.usageError("one KEY expected, got %d arguments", len(args))
	case args[0] == "":
		return name{}, f.usageError("KEY is empty")
	}
	arg, err := argField(args[0])
	if err != nil {
		return name{}, f.usageError("KEY: %v", err)
	}
	n := name{key: arg}
	if scope != "" {
		if n.scope, err = argField(scope); err != nil {
			return name{}, f.usageError("--scope: %v", err)
		}
		n.scoped = true
		return n, exitOK
	}
	if kind, err := backend.KindOf(store); err == nil && hashedNames(kind) {
		n = name{id: arg}
	}
	return n, exitOK
}

// openInspector opens the store named by spec, which must outlive this
// process and implement idemstore.Inspector.
func openInspector(ctx context.Context, spec string) (idemstore.Inspector, *backend.Store, error) {
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
	in, ok := s.Records.(idemstore.Inspector)
	if !ok {
		s.Close()
		return nil, nil, fmt.Errorf("%s cannot be inspected", s.Where)
	}
	return in, s, nil
}

// lookup returns the record n names: at its ID, in its scope, or in every
// scope holding its key (at most lookupMax of them; more reports that
// there were others).
func lookup(ctx context.Context, in idemstore.Inspector, n name) (recs []idemstore.RecordInfo, more bool, err error) {
	now := time.Now()
	if n.id != "" || n.scoped {
		r, err := in.Get(ctx, idemstore.GetParams{Scope: n.scope, Key: n.key, ID: n.id, Now: now})
		if errors.Is(err, idemstore.ErrNotFound) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		return []idemstore.RecordInfo{r}, false, nil
	}
	p := idemstore.ListParams{Key: n.key, Limit: lookupMax + 1, Now: now}
	for {
		page, err := in.List(ctx, p)
		if err != nil {
			return nil, false, err
		}
		for _, f := range page.Records {
			if len(recs) == lookupMax {
				return recs, true, nil
			}
			r, err := in.Get(ctx, idemstore.GetParams{Scope: f.Scope, Key: f.Key, Now: now})
			if errors.Is(err, idemstore.ErrNotFound) {
				continue // gone since the listing
			}
			if err != nil {
				return nil, false, err
			}
			recs = append(recs, r)
		}
		if p.After = page.Next; p.After == "" {
			return recs, false, nil
		}
	}
}

func printRecord(w io.Writer, r idemstore.RecordInfo, showBody bool, encryption string) {
	tw := newTable(w, 1)
	line := func(k, format string, args ...any) {
		fmt.Fprintf(tw, "%s:\t"+format+"\n", append([]any{k}, args...)...)
	}
	if r.Scope != "" || r.Key != "" || r.ID == "" {
		line("scope", "%s", termField(r.Scope))
		line("key", "%s", termField(r.Key))
	}
	if r.ID != "" {
		line("store id", "%s", termField(r.ID))
	}
	if r.Held() {
		line("state", "%s, held for an operator: reconciliation gave up on it; a retry with its key still resumes it", r.State)
	} else {
		line("state", "%s", r.State)
	}
	line("fingerprint", "%s", termField(r.Fingerprint))
	line("fingerprint version", "%s", termField(r.FingerprintVersion()))
	line("expires at", "%s (in %s)", r.ExpiresAt.Format(time.RFC3339Nano), time.Until(r.ExpiresAt).Round(time.Second))
	if r.State == idemstore.StateInFlight && !r.Held() {
		line("lease until", "%s (%s)", r.LeaseExpiresAt.Format(time.RFC3339Nano), leaseState(r.LeaseExpiresAt))
	}
	if encryption != "" {
		text, _ := termText(encryption, false)
		line("encryption", "%s", text)
	}
	printSteps(line, r)
	var body string
	if resp := r.Response; resp != nil {
		line("response status", "%d", resp.StatusCode)
		line("response size", "%d bytes stored (body %d bytes, %d header fields)", r.ResponseSize, len(resp.Body), len(resp.Header))
		if resp.Unreplayable {
			line("replayable", "no (the body was too large or streamed; retries get 409 idempotency.response_unavailable)")
		}
		if showBody {
			var how string
			body, how = bodyText(resp.Body)
			line("body shown", "%s", how)
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
			name, _ := termText(k, false)
			for _, v := range r.Response.Header[k] {
				value, _ := termText(v, false)
				fmt.Fprintf(w, "%s: %s\n", name, value)
			}
		}
		fmt.Fprintln(w)
		fmt.Fprint(w, body)
		if body != "" && body[len(body)-1] != '\n' {
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
