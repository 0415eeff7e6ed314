package cli

import (
	"context"
	crand "crypto/rand"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/idemstore"
	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// operatorStores returns, per store kind, a function giving a --store value
// for a fresh, isolated store: a SQLite file, a PostgreSQL schema (dropped
// afterwards) or a Redis key prefix (its keys deleted afterwards).
// Server-backed ones skip when the server is unreachable and CI is unset.
func operatorStores() map[string]func(t *testing.T) string {
	return map[string]func(t *testing.T) string{
		"sqlite": func(t *testing.T) string { return filepath.Join(t.TempDir(), "records.db") },
		"postgres": func(t *testing.T) string {
			admin := os.Getenv("IDEM_TEST_POSTGRES_URL")
			if admin == "" {
				admin = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
			}
			cfg, err := pgx.ParseConfig(admin)
			if err != nil {
				t.Fatal(err)
			}
			reachable(t, net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
			schema := "idem_ops_" + strings.ToLower(crand.Text()[:10])
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				conn, err := pgx.Connect(ctx, admin)
				if err != nil {
					t.Errorf("drop schema: %v", err)
					return
				}
				defer conn.Close(ctx)
				if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
					t.Errorf("drop schema: %v", err)
				}
			})
			return withQuery(t, admin, "idem_schema", schema)
		},
		"redis": func(t *testing.T) string {
			raw := os.Getenv("IDEM_TEST_REDIS_URL")
			if raw == "" {
				raw = "redis://127.0.0.1:6379/0"
			}
			opts, err := redis.ParseURL(raw)
			if err != nil {
				t.Fatal(err)
			}
			reachable(t, opts.Addr)
			prefix := "idemops:" + crand.Text() + ":"
			t.Cleanup(func() {
				c := redis.NewClient(opts)
				defer c.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				keys, _ := c.Keys(ctx, prefix+"*").Result()
				if len(keys) > 0 {
					if err := c.Del(ctx, keys...).Err(); err != nil {
						t.Errorf("delete %s*: %v", prefix, err)
					}
				}
			})
			return withQuery(t, raw, "prefix", prefix)
		},
	}
}

func withQuery(t *testing.T, raw, name, value string) string {
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

func reachable(t *testing.T, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 3*time.Second)
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s unreachable: %v", addr, err)
		}
		t.Skipf("%s unreachable (set CI to make this fail): %v", addr, err)
	}
	c.Close()
}

// run runs the idem command and returns its exit code, stdout and stderr.
func run(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errs syncBuffer
	code := Main(t.Context(), args, &out, &errs)
	return code, out.String(), errs.String()
}

func TestOperatorCommands(t *testing.T) {
	t.Parallel()
	for name, newStore := range operatorStores() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spec := newStore(t)
			scope := idem.Scope("acme", "POST /payments")
			// Seed one completed record, one in flight, through the store.
			s, err := backend.Open(t.Context(), spec)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			claim := func(key string) idemstore.ClaimParams {
				p := idemstore.ClaimParams{Scope: scope, Key: key, Fingerprint: idem.FingerprintVersion + ":abc", Token: "tok-" + key,
					Lease: time.Minute, TTL: time.Hour, Now: now}
				if _, err := s.Records.Claim(t.Context(), p); err != nil {
					t.Fatal(err)
				}
				return p
			}
			done := claim("order-1")
			resp := &idem.Response{StatusCode: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}},
				Body: []byte(`{"id":"pay_1","secret":"card-4242"}`)}
			if err := s.Records.Complete(t.Context(), idemstore.CompleteParams{Scope: scope, Key: done.Key, Token: done.Token, Response: resp, Now: now}); err != nil {
				t.Fatal(err)
			}
			running := claim("order-2")
			s.Close()

			// inspect: state, fingerprint version, sizes; no body without --show-body.
			code, out, errs := run(t, "inspect", "--store", spec, "--scope", scope, "order-1")
			if code != exitOK {
				t.Fatalf("inspect: exit %d: %s", code, errs)
			}
			for _, want := range []string{"state:               completed", "fingerprint version: v1", "response status:     201",
				"body 35 bytes", "key:                 order-1"} {
				if !strings.Contains(out, want) {
					t.Errorf("inspect output lacks %q:\n%s", want, out)
				}
			}
			if strings.Contains(out, "card-4242") {
				t.Errorf("inspect printed the body without --show-body:\n%s", out)
			}
			code, out, _ = run(t, "inspect", "--store", spec, "--scope", scope, "--show-body", "order-1")
			if code != exitOK || !strings.Contains(out, `{"id":"pay_1","secret":"card-4242"}`) || !strings.Contains(out, "Content-Type: application/json") {
				t.Errorf("inspect --show-body: exit %d:\n%s", code, out)
			}
			code, out, _ = run(t, "inspect", "--store", spec, "--scope", scope, "--json", "order-2")
			var recs []recordJSON
			if err := json.Unmarshal([]byte(out), &recs); code != exitOK || err != nil || len(recs) != 1 {
				t.Fatalf("inspect --json: exit %d, %v:\n%s", code, err, out)
			}
			if r := recs[0]; r.State != "in-flight" || r.LeaseExpiresAt == nil || r.LeaseExpiresAt.Before(now) || r.Body != nil {
				t.Errorf("inspect --json of the in-flight record: %+v", r)
			}
			if code, _, errs = run(t, "inspect", "--store", spec, "--scope", scope, "order-9"); code != exitError || !strings.Contains(errs, "no record") {
				t.Errorf("inspect of an absent key: exit %d: %s", code, errs)
			}
			if _, _, errs = run(t, "inspect", "--store", spec, "--scope", scope, "order-9"); strings.Contains(errs, "order-9") {
				t.Errorf("the key appears in an error message: %s", errs)
			}
			if name != "redis" {
				// Without --scope, the key is found in its scope.
				code, out, _ = run(t, "inspect", "--store", spec, "order-1")
				if code != exitOK || !strings.Contains(out, "acme") {
					t.Errorf("inspect without --scope: exit %d:\n%s", code, out)
				}
			} else {
				// Redis cannot find a key without its scope, and says
				// what to give instead, in the command's terms.
				code, _, errs = run(t, "inspect", "--store", spec, "order-1")
				if code != exitError || !strings.Contains(errs, "--scope") || !strings.Contains(errs, "idem ls") {
					t.Errorf("inspect without --scope on Redis: exit %d: %s", code, errs)
				}
			}

			// ls: both, then each state.
			code, out, errs = run(t, "ls", "--store", spec)
			if code != exitOK || strings.Count(out, "\n") != 3 || !strings.Contains(out, "in-flight") || !strings.Contains(out, "completed") {
				t.Errorf("ls: exit %d: %s\n%s", code, errs, out)
			}
			if errs != "" {
				t.Errorf("ls of every record printed a cursor: %s", errs)
			}
			ls := lsJSON(t, "--store", spec, "--state", "in-flight")
			if len(ls.Records) != 1 || ls.Records[0].State != "in-flight" || ls.Next != "" {
				t.Errorf("ls --state in-flight: %+v", ls)
			}
			if name != "redis" && (len(ls.Records) != 1 || ls.Records[0].Key != running.Key) {
				t.Errorf("ls --state in-flight: %+v", ls.Records)
			}
			if ls = lsJSON(t, "--store", spec, "--limit", "1"); len(ls.Records) > 1 || ls.Next == "" {
				t.Errorf("ls --limit 1: %+v", ls)
			}
			if name == "redis" {
				// inspect and delete take the ID ls prints, from its
				// table and from its JSON.
				code, out, _ = run(t, "ls", "--store", spec, "--state", "in-flight")
				lines := strings.Split(strings.TrimSpace(out), "\n")
				if code != exitOK || len(lines) != 2 || !strings.HasSuffix(lines[0], "ID") {
					t.Fatalf("ls on Redis: exit %d:\n%s", code, out)
				}
				fields := strings.Fields(lines[1])
				id := fields[len(fields)-1]
				if code, out, errs = run(t, "inspect", "--store", spec, id); code != exitOK || !strings.Contains(out, "in-flight") || !strings.Contains(out, id) {
					t.Errorf("inspect %s: exit %d: %s\n%s", id, code, errs, out)
				}
				if code, _, errs = run(t, "delete", "--store", spec, id); code != exitError || !strings.Contains(errs, "--force") {
					t.Errorf("delete %s in flight: exit %d: %s", id, code, errs)
				}
				done := lsJSON(t, "--store", spec, "--state", "completed")
				if len(done.Records) != 1 || done.Records[0].ID == "" {
					t.Fatalf("ls --state completed --json on Redis: %+v", done)
				}
				code, out, errs = run(t, "inspect", "--store", spec, "--json", "--show-body", done.Records[0].ID)
				if code != exitOK || !strings.Contains(out, "card-4242") {
					t.Errorf("inspect by the JSON ID: exit %d: %s\n%s", code, errs, out)
				}
				if code, _, errs = run(t, "inspect", "--store", spec, "idem:{nothex}"); code != exitError || !strings.Contains(errs, "not a record ID") {
					t.Errorf("inspect of a malformed ID: exit %d: %s", code, errs)
				}
				missing := id[:len(id)-3] + "00}"
				if code, _, errs = run(t, "inspect", "--store", spec, missing); code != exitError || !strings.Contains(errs, "no record for this ID") {
					t.Errorf("inspect of an absent ID: exit %d: %s", code, errs)
				}
				if code, _, errs = run(t, "delete", "--store", spec, "--force", id); code != exitOK {
					t.Errorf("delete --force %s: exit %d: %s", id, code, errs)
				}
				if code, _, _ = run(t, "inspect", "--store", spec, id); code != exitError {
					t.Errorf("inspect after delete by ID: exit %d", code)
				}
				// The rest of the test needs the in-flight record again.
				if s, err = backend.Open(t.Context(), spec); err != nil {
					t.Fatal(err)
				}
				claim(running.Key)
				s.Close()
			}

			// delete: refuses the in-flight record without --force.
			code, _, errs = run(t, "delete", "--store", spec, "--scope", scope, running.Key)
			if code != exitError || !strings.Contains(errs, "--force") {
				t.Errorf("delete in flight: exit %d: %s", code, errs)
			}
			if code, _, _ = run(t, "inspect", "--store", spec, "--scope", scope, running.Key); code != exitOK {
				t.Error("the refused delete removed the record")
			}
			for _, key := range []string{running.Key, done.Key} {
				if code, _, errs = run(t, "delete", "--store", spec, "--scope", scope, "--force", key); code != exitOK {
					t.Errorf("delete --force %s: exit %d: %s", key, code, errs)
				}
			}
			if ls = lsJSON(t, "--store", spec); len(ls.Records) != 0 || ls.Next != "" {
				t.Errorf("ls after deleting everything: %+v", ls)
			}
			if code, _, _ = run(t, "delete", "--store", spec, "--scope", scope, done.Key); code != exitError {
				t.Errorf("delete of a deleted key: exit %d", code)
			}
		})
	}
}

// lsListing is idem ls --json's output.
type lsListing struct {
	Records []recordJSON `json:"records"`
	Next    string       `json:"next"`
}

// lsJSON runs idem ls --json with args and decodes its output.
func lsJSON(t *testing.T, args ...string) lsListing {
	t.Helper()
	code, out, errs := run(t, append([]string{"ls", "--json"}, args...)...)
	var ls lsListing
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ls); code != exitOK || err != nil {
		t.Fatalf("ls --json %v: exit %d, %v: %s\n%s", args, code, err, errs, out)
	}
	return ls
}

func TestOperatorCommandUsage(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "none.db")
	for _, args := range [][]string{
		{"inspect", "--store", path},
		{"inspect", "--store", path, "a", "b"},
		{"delete", "--store", path},
		{"ls", "--store", path, "--state", "done"},
		{"ls", "--store", path, "--limit", "0"},
		{"inspect", "--store", path, `"unterminated`},
		{"inspect", "--store", path, "--scope", `"bad\q"`, "k"},
	} {
		if code, _, _ := run(t, args...); code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
	}
	// A missing SQLite file is an error, not a new empty database.
	if code, _, errs := run(t, "ls", "--store", path); code != exitError || !strings.Contains(errs, "no such file") {
		t.Errorf("ls on a missing file: exit %d: %s", code, errs)
	}
	if _, err := os.Stat(path); err == nil {
		t.Error("ls created the SQLite file")
	}
	if code, _, _ := run(t, "ls", "--store", "memory"); code != exitError {
		t.Errorf("ls on memory: exit %d", code)
	}
}
