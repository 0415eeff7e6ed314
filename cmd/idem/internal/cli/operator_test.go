package cli

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/idemstore"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// terminalSafe fails the test if out holds anything a terminal would act
// on: C0 controls but newline and tab, DEL, C1 controls, Unicode format
// characters (bidirectional overrides), or bytes that are not UTF-8. It is
// written apart from the code's own escaped, so that a mistake there
// cannot hide here.
func terminalSafe(t *testing.T, what, out string) {
	t.Helper()
	for i, r := range out {
		bad := ""
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(out[i:], "\uFFFD"):
			bad = "a byte that is not UTF-8"
		case r < 0x20 && r != '\n' && r != '\t', r == 0x7f:
			bad = "a C0 control or DEL"
		case r >= 0x80 && r <= 0x9f:
			bad = "a C1 control"
		case unicode.Is(unicode.Cf, r):
			bad = "a format character"
		}
		if bad != "" {
			t.Errorf("%s: %s (%U) at byte %d reached the output: %q", what, bad, r, i, out[max(0, i-20):min(len(out), i+20)])
			return
		}
	}
}

// seed writes records into the store at spec through its idemstore.Store, as
// a server would: claimed, then completed with resp when it is not nil.
func seed(t *testing.T, spec string, recs ...seedRecord) {
	t.Helper()
	s, err := backend.Open(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	for _, r := range recs {
		p := idemstore.ClaimParams{Scope: r.scope, Key: r.key, Fingerprint: idem.FingerprintVersion + ":abc", Token: "tok",
			Lease: time.Hour, TTL: 2 * time.Hour, Now: now}
		if _, err := s.Records.Claim(t.Context(), p); err != nil {
			t.Fatal(err)
		}
		if r.resp == nil {
			continue
		}
		if err := s.Records.Complete(t.Context(), idemstore.CompleteParams{Scope: r.scope, Key: r.key, Token: p.Token, Response: r.resp, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
}

type seedRecord struct {
	scope, key string
	resp       *idem.Response
}

// A stored body, header field, scope or key holding terminal controls (an
// OSC 52 sequence sets the clipboard of many terminals) never reaches
// stdout raw, in text or JSON, from inspect or ls; --json gives the exact
// values back; and what ls prints, quoted forms included, names the record
// for inspect and delete.
func TestOperatorOutputEscapesControls(t *testing.T) {
	t.Parallel()
	const osc52 = "\x1b]52;c;SGVsbG8=\x07"
	body := "ok " + osc52 + " csi:\u009b31m del:\x7f bidi:\u202e cr:\r\nline 2\ttab\n"
	scope := idem.Scope("evil\x1b[2J\u202e", "POST /x")
	key := "k\x1b]0;title\x07 1"
	resp := &idem.Response{StatusCode: http.StatusCreated, Body: []byte(body),
		Header: http.Header{"X-Evil": {"v\x1b[31m\u0085"}, "X-\x1bName": {"a"}}}
	for name, newStore := range operatorStores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spec := newStore(t)
			seed(t, spec, seedRecord{scope, key, resp})

			code, out, errs := run(t, "inspect", "--store", spec, "--scope", scope, "--show-body", key)
			if code != exitOK {
				t.Fatalf("inspect --show-body: exit %d: %s", code, errs)
			}
			terminalSafe(t, "inspect --show-body", out)
			for _, want := range []string{`ok \x1b]52;c;SGVsbG8=\a csi:\u009b31m del:\x7f bidi:\u202e cr:\r`, "line 2\ttab",
				`X-Evil: v\x1b[31m\u0085`, `X-\x1bName: a`, "6 control characters escaped", `"k\x1b]0;title\a 1"`} {
				if !strings.Contains(out, want) {
					t.Errorf("inspect --show-body lacks %q:\n%s", want, out)
				}
			}

			code, out, errs = run(t, "inspect", "--store", spec, "--scope", scope, "--show-body", "--json", key)
			if code != exitOK {
				t.Fatalf("inspect --json: exit %d: %s", code, errs)
			}
			terminalSafe(t, "inspect --json", out)
			var recs []recordJSON
			if err := json.Unmarshal([]byte(out), &recs); err != nil || len(recs) != 1 {
				t.Fatalf("inspect --json: %v:\n%s", err, out)
			}
			r := recs[0]
			if r.Body == nil || *r.Body != body || r.BodyEncoding != "utf-8" {
				t.Errorf("inspect --json: body %q (%s), want %q", deref(r.Body), r.BodyEncoding, body)
			}
			if got := r.Header["X-Evil"]; len(got) != 1 || got[0] != resp.Header["X-Evil"][0] {
				t.Errorf("inspect --json: X-Evil = %q", got)
			}
			if name != "redis" && (r.Scope != scope || r.Key != key || r.ScopeQuoted || r.KeyQuoted) {
				t.Errorf("inspect --json: scope %q key %q (quoted %v %v)", r.Scope, r.Key, r.ScopeQuoted, r.KeyQuoted)
			}

			code, out, errs = run(t, "ls", "--store", spec)
			if code != exitOK {
				t.Fatalf("ls: exit %d: %s", code, errs)
			}
			terminalSafe(t, "ls", out)
			code, jsonOut, _ := run(t, "ls", "--store", spec, "--json")
			terminalSafe(t, "ls --json", jsonOut)
			if code != exitOK {
				t.Fatalf("ls --json: exit %d", code)
			}
			if name == "redis" {
				return // no scope or key to print; the ID is plain ASCII
			}
			// The scope and key ls prints (quoted, since they hold controls
			// and spaces) name the record for inspect and delete.
			lsScope, lsKey := tableFields(t, out, "SCOPE", 2)
			if lsScope != strconv.Quote(scope) || lsKey != strconv.Quote(key) {
				t.Errorf("ls printed scope %s key %s, want the quoted forms", lsScope, lsKey)
			}
			if code, out, errs = run(t, "inspect", "--store", spec, "--scope", lsScope, lsKey); code != exitOK || !strings.Contains(out, "completed") {
				t.Errorf("inspect with what ls printed: exit %d: %s", code, errs)
			}
			ls := lsJSON(t, "--store", spec)
			if len(ls.Records) != 1 || ls.Records[0].Scope != scope || ls.Records[0].Key != key {
				t.Fatalf("ls --json: %+v", ls)
			}
			if code, _, errs = run(t, "delete", "--store", spec, "--scope", ls.Records[0].Scope, ls.Records[0].Key); code != exitOK {
				t.Errorf("delete with what ls --json printed: exit %d: %s", code, errs)
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// tableFields returns the n fields of ls's first row from the column
// titled title on: each a quoted value (strconv.QuotedPrefix) or a word.
func tableFields(t *testing.T, out, title string, n int) (string, string) {
	t.Helper()
	lines := strings.Split(out, "\n")
	at := strings.Index(lines[0], title)
	if at < 0 || len(lines) < 2 || len(lines[1]) < at {
		t.Fatalf("no %s column in:\n%s", title, out)
	}
	rest := lines[1][at:]
	var fields []string
	for len(fields) < n {
		rest = strings.TrimLeft(rest, " ")
		f, err := strconv.QuotedPrefix(rest)
		if err != nil {
			f, _, _ = strings.Cut(rest, " ")
		}
		fields = append(fields, f)
		rest = rest[len(f):]
	}
	return fields[0], fields[1]
}

// A body that is not UTF-8 text (gzip here) comes out of --json as base64,
// exactly, and out of the text form as base64 too, never raw.
func TestInspectBinaryBody(t *testing.T) {
	t.Parallel()
	body := []byte{0x1f, 0x8b, 0x08, 0x00, 0xff, 0xfe, 0x1b, ']', '5', '2', ';', 0x07, 0xc2, 0x9b, 0x80, 0x00}
	for i := range 300 {
		body = append(body, byte(i*7))
	}
	resp := &idem.Response{StatusCode: http.StatusOK, Body: body,
		Header: http.Header{"Content-Encoding": {"gzip"}, "X-Raw": {"a\xffb"}}}
	for name, newStore := range operatorStores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spec := newStore(t)
			scope := idem.Scope("t", "GET /file")
			seed(t, spec, seedRecord{scope, "bin-1", resp})

			code, out, errs := run(t, "inspect", "--store", spec, "--scope", scope, "--show-body", "--json", "bin-1")
			if code != exitOK {
				t.Fatalf("inspect --json: exit %d: %s", code, errs)
			}
			terminalSafe(t, "inspect --json", out)
			var recs []recordJSON
			if err := json.Unmarshal([]byte(out), &recs); err != nil || len(recs) != 1 {
				t.Fatalf("inspect --json: %v:\n%s", err, out)
			}
			r := recs[0]
			if r.BodyEncoding != "base64" || r.Body == nil {
				t.Fatalf("inspect --json: bodyEncoding %q, body %v", r.BodyEncoding, r.Body)
			}
			got, err := base64.StdEncoding.DecodeString(*r.Body)
			if err != nil || !bytes.Equal(got, body) {
				t.Errorf("the base64 body decodes to %x (%v), want %x", got, err, body)
			}
			if v := r.Header["X-Raw"]; len(v) != 1 || v[0] != `a\xffb` {
				t.Errorf("a header value that is not UTF-8: %q", v)
			}

			code, out, errs = run(t, "inspect", "--store", spec, "--scope", scope, "--show-body", "bin-1")
			if code != exitOK {
				t.Fatalf("inspect --show-body: exit %d: %s", code, errs)
			}
			terminalSafe(t, "inspect --show-body", out)
			if !strings.Contains(out, "in base64") || !strings.Contains(strings.ReplaceAll(out, "\n", ""), base64.StdEncoding.EncodeToString(body)) {
				t.Errorf("inspect --show-body of a binary body:\n%s", out)
			}
		})
	}
}

// idem ls over 10,500 records (more than ten pages): through its own
// paging (JSON, one big --limit) and resumed with the cursor it prints
// (from the table's stderr and from the JSON's "next"): every key exactly
// once, nothing else, and a cursor only while records remain.
func TestLsPagesEveryKeyOnce(t *testing.T) {
	t.Parallel()
	stores := operatorStores()
	// A Redis of the test's own: SCAN lists a key twice only when Redis
	// shrinks its table, which other tests' deletions on a shared server
	// could cause.
	stores["redis"] = func(t *testing.T) string { return "redis://" + startRedisServer(t) + "/0" }
	const n = 10*lsPage + 500
	for name, newStore := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spec := newStore(t)
			want := seedMany(t, spec, n)
			hashed := name == "redis"

			// JSON: many pages in one command, then resumed with "next".
			first := lsJSON(t, "--store", spec, "--limit", "6000")
			if len(first.Records) != 6000 && !hashed || first.Next == "" {
				t.Fatalf("ls --limit 6000 of %d records: %d records, next %q", n, len(first.Records), first.Next)
			}
			rest := lsJSON(t, "--store", spec, "--limit", strconv.Itoa(2*n), "--after", first.Next)
			if rest.Next != "" {
				t.Errorf("ls of the remaining records ended with a cursor %q", rest.Next)
			}
			checkOnce(t, "ls --json, then --after next", append(jsonNames(first.Records, hashed), jsonNames(rest.Records, hashed)...), want)

			// The table, resumed with the cursor it prints on stderr.
			var names []string
			args := []string{"ls", "--store", spec, "--limit", "4000"}
			for pages := 0; ; pages++ {
				code, out, errs := run(t, args...)
				if code != exitOK {
					t.Fatalf("%v: exit %d: %s", args, code, errs)
				}
				rows := strings.Split(strings.TrimSpace(out), "\n")[1:]
				for _, row := range rows {
					f := strings.Fields(row)
					names = append(names, f[len(f)-1])
				}
				_, cursor, ok := strings.Cut(strings.TrimSpace(errs), "go on with --after ")
				if !ok {
					if errs != "" {
						t.Errorf("%v: stderr %q", args, errs)
					}
					break
				}
				if len(rows) != 4000 && !hashed {
					t.Errorf("run %d of a table walk printed %d rows, want 4000", pages, len(rows))
				}
				if pages > n {
					t.Fatal("the walk does not end")
				}
				args = []string{"ls", "--store", spec, "--limit", "4000", "--after", cursor}
			}
			checkOnce(t, "ls --after (table)", names, want)

			if code, _, errs := run(t, "ls", "--store", spec, "--after", "k1.nonsense!"); code != exitError || !strings.Contains(errs, "--after: not a cursor") {
				t.Errorf("ls --after garbage: exit %d: %s", code, errs)
			}
		})
	}
}

// seedMany stores n records, keys page-00000 and on (every fifth
// completed), and returns the names ls shows for them: the keys, or on
// Redis the IDs. The SQL stores get one INSERT of all the rows, in the
// tables' layout (migrations/): claiming them one by one takes a minute
// under the race detector with modernc's SQLite; Redis gets them through
// the store, from eight writers.
func seedMany(t *testing.T, spec string, n int) map[string]bool {
	t.Helper()
	s, err := backend.Open(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	scope := idem.Scope("", "POST /pages")
	names := map[string]bool{}
	for i := range n {
		names[fmt.Sprintf("page-%05d", i)] = true
	}
	resp, err := (&idem.Response{StatusCode: 201, Body: []byte("{}")}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	switch s.Kind {
	case backend.SQLite:
		_, err = s.SQLite.DB().ExecContext(t.Context(), `WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i+1 FROM n WHERE i < ?)
INSERT INTO idem_records (scope, key, fingerprint, state, token, lease_until, expires_at, response)
SELECT ?, printf('page-%05d', i), 'v1:abc', CASE WHEN i % 5 = 0 THEN 2 ELSE 1 END, CASE WHEN i % 5 = 0 THEN NULL ELSE 'tok' END,
       CASE WHEN i % 5 = 0 THEN 0 ELSE ? END, ?, CASE WHEN i % 5 = 0 THEN ? END FROM n`,
			n-1, scope, now.Add(time.Hour).UnixNano(), now.Add(2*time.Hour).UnixNano(), resp)
	case backend.Postgres:
		u, perr := url.Parse(spec)
		if perr != nil {
			t.Fatal(perr)
		}
		table := pgx.Identifier{u.Query().Get("idem_schema"), "idempotency_records"}.Sanitize()
		_, err = s.PG.Exec(t.Context(), `INSERT INTO `+table+` (scope, key, fingerprint, token, lease_expires_at, expires_at, response)
SELECT $1, 'page-' || lpad(i::text, 5, '0'), 'v1:abc', CASE WHEN i % 5 = 0 THEN NULL ELSE 'tok' END,
       CASE WHEN i % 5 = 0 THEN NULL ELSE now() + interval '1 hour' END, now() + interval '2 hours',
       CASE WHEN i % 5 = 0 THEN $2::bytea END
FROM generate_series(0, $3 - 1) i`, scope, resp, n)
	default:
		names = seedThroughStore(t, s, scope, n)
	}
	if err != nil {
		t.Fatal(err)
	}
	// The rows are records as the store reads them.
	if code, out, errs := run(t, "inspect", "--store", spec, "--scope", scope, "page-00005"); code != exitOK || !strings.Contains(out, "completed") {
		t.Fatalf("inspect of a seeded record: exit %d: %s\n%s", code, errs, out)
	}
	return names
}

// seedThroughStore claims n keys through s (every fifth completed) with
// eight writers and returns the records' IDs.
func seedThroughStore(t *testing.T, s *backend.Store, scope string, n int) map[string]bool {
	t.Helper()
	var (
		mu    sync.Mutex
		names = map[string]bool{}
		wg    sync.WaitGroup
		errs  = make(chan error, 8)
	)
	now := time.Now()
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				key := fmt.Sprintf("page-%05d", i)
				p := idemstore.ClaimParams{Scope: scope, Key: key, Fingerprint: idem.FingerprintVersion + ":abc", Token: "tok-" + key,
					Lease: time.Hour, TTL: 2 * time.Hour, Now: now}
				if _, err := s.Records.Claim(t.Context(), p); err != nil {
					errs <- err
					return
				}
				if i%5 == 0 {
					if err := s.Records.Complete(t.Context(), idemstore.CompleteParams{Scope: scope, Key: key, Token: p.Token,
						Response: &idem.Response{StatusCode: 201, Body: []byte("{}")}, Now: now}); err != nil {
						errs <- err
						return
					}
				}
				name := key
				if rs, ok := s.Records.(interface {
					Key(scope, key string) string
				}); ok {
					name = rs.Key(scope, key)
				}
				mu.Lock()
				names[name] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return names
}

func jsonNames(recs []recordJSON, hashed bool) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.Key
		if hashed {
			out[i] = r.ID
		}
	}
	return out
}

// checkOnce checks that got holds every name of want exactly once, and
// nothing else.
func checkOnce(t *testing.T, what string, got []string, want map[string]bool) {
	t.Helper()
	seen := make(map[string]int, len(got))
	for _, g := range got {
		seen[g]++
	}
	missing, twice, extra := 0, 0, 0
	for w := range want {
		switch seen[w] {
		case 0:
			missing++
		case 1:
		default:
			twice++
		}
	}
	for g := range seen {
		if !want[g] {
			extra++
		}
	}
	if missing+twice+extra > 0 || len(got) != len(want) {
		t.Errorf("%s: %d names for %d records: %d missing, %d listed more than once, %d unknown", what, len(got), len(want), missing, twice, extra)
	}
}

// startRedisServer starts a redis-server of the test's own, without
// persistence, on a free loopback port, stops it when t ends, and returns
// its address. It skips when redis-server is not installed and CI is
// unset.
func startRedisServer(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server not installed")
		}
		t.Skip("redis-server not installed (set CI to make this fail)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for c.Ping(ctx).Err() != nil {
		select {
		case err := <-exited:
			t.Fatalf("redis-server exited (%v): %s", err, stderr.String())
		case <-ctx.Done():
			t.Fatalf("redis-server did not answer PING within 10 s: %s", stderr.String())
		case <-tick.C:
		}
	}
	return addr
}

// No message of the CLI names a Go API: an operator runs commands, not
// functions ("use Get"). This reads every string literal of the package's
// code, and the messages of the commands' failure paths on Redis, where
// the store's own errors mention its methods.
func TestCLIMessagesNameNoGoAPI(t *testing.T) {
	t.Parallel()
	goAPI := regexp.MustCompile(`\b(Get|List|Delete|Claim|Complete|Release|Renew|DeleteExpired|Inspector|ListParams|GetParams|DeleteParams|RecordInfo|ListPage|ErrNotFound|ErrInvalidCursor|ErrInvalidID|MaxTTL)\b|\bidem\.[A-Z]\w*|\b[a-z]+store\.[A-Z]\w*`)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatalf("%s: %v", fset.Position(lit.Pos()), err)
			}
			if m := goAPI.FindString(s); m != "" {
				t.Errorf("%s: a message names the Go API %q: %q", fset.Position(lit.Pos()), m, s)
			}
			return true
		})
	}

	spec := operatorStores()["redis"](t)
	scope := idem.Scope("acme", "POST /payments")
	seed(t, spec, seedRecord{scope, "order-1", nil})
	for _, args := range [][]string{
		{"inspect", "--store", spec, "order-1"},
		{"delete", "--store", spec, "order-1"},
		{"inspect", "--store", spec, "idem:{00}"},
		{"ls", "--store", spec, "--after", "k1.AAAA"},
		{"ls", "--store", spec, "--after", "r1.AAAA"},
		{"delete", "--store", spec, "--scope", scope, "order-1"},
	} {
		code, _, errs := run(t, args...)
		if code == exitOK || errs == "" {
			t.Errorf("%v: exit %d, stderr %q: want a failure", args, code, errs)
		}
		if m := goAPI.FindString(errs); m != "" {
			t.Errorf("%v: the message names the Go API %q: %s", args, m, errs)
		}
	}
}
