package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
)

// benchRecords is the store size of BenchmarkPages: IDEM_CONSOLE_BENCH_RECORDS
// (docs/BENCHMARKS.md uses 1000000), 20000 by default so that the
// benchmark's smoke run in scripts/test.sh stays short.
func benchRecords(b *testing.B) int {
	n := 20_000
	if v := os.Getenv("IDEM_CONSOLE_BENCH_RECORDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1000 {
			b.Fatalf("IDEM_CONSOLE_BENCH_RECORDS=%q: want a number of at least 1000", v)
		}
	}
	return n
}

// The seeded store: n records over 7 scopes; one in a thousand in flight
// (half of those suspended after a step, a third with a live lease), one
// in a hundred expired awaiting cleanup, the others completed with a
// 300-byte response.
const benchScopes = 7

func benchScope(i int) string {
	return idem.Scope("t_"+strconv.Itoa(i%benchScopes), "POST /api/payments")
}

func benchKey(i int) string { return fmt.Sprintf("%08x-key-%d", uint32(i)*2654435761, i) }

func seedSQL(b testing.TB, s *backend.Store, n int) {
	ctx := context.Background()
	resp, err := (&idem.Response{StatusCode: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"pay_` + strings.Repeat("x", 280) + `"}`)}).MarshalBinary()
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	scopes := make([]string, benchScopes)
	for i := range scopes {
		scopes[i] = benchScope(i)
	}
	start := time.Now()
	switch {
	case s.SQLite != nil:
		t := s.SQLite.Table()
		var have int
		if err := s.SQLite.ReadDB().QueryRowContext(ctx, `SELECT count(*) FROM `+t).Scan(&have); err != nil {
			b.Fatal(err)
		}
		if have == n {
			return // seeded by an earlier run (IDEM_CONSOLE_BENCH_DIR)
		}
		tx, err := s.SQLite.DB().BeginTx(ctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		st, err := tx.PrepareContext(ctx, `INSERT INTO `+t+` (scope, key, fingerprint, state, token, lease_until, expires_at, response, fence, checkpoint)
			VALUES (?, ?, 'v1:0123456789abcdef', ?, ?, ?, ?, ?, ?, ?)`)
		if err != nil {
			b.Fatal(err)
		}
		for i := range n {
			state, token, lease, exp, body, cp := benchRow(i, now, resp)
			var tok any
			if token != "" {
				tok = token
			}
			var l int64
			if !lease.IsZero() {
				l = lease.UnixNano()
			}
			if _, err := st.ExecContext(ctx, scopes[i%benchScopes], benchKey(i), state, tok, l, exp.UnixNano(), body, i+1, cp); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
	case s.PG != nil:
		t := s.Records.(interface{ Table() string }).Table()
		if _, err := s.PG.Exec(ctx, `INSERT INTO `+t+` (scope, key, fingerprint, token, lease_expires_at, expires_at, response, fence, checkpoint)
			SELECT (ARRAY[`+pgArray(scopes)+`])[i % `+strconv.Itoa(benchScopes)+` + 1],
			  lpad(to_hex((i::bigint * 2654435761) % 4294967296), 8, '0') || '-key-' || i,
			  'v1:0123456789abcdef',
			  CASE WHEN i % 1000 = 0 THEN 'tok' || i END,
			  CASE WHEN i % 1000 = 0 THEN now() + (CASE WHEN i % 3000 = 0 THEN interval '1 hour' ELSE interval '-1 minute' END) END,
			  CASE WHEN i % 100 = 1 THEN now() - interval '1 minute' ELSE now() + (i % 86400) * interval '1 second' END,
			  CASE WHEN i % 1000 <> 0 THEN $1::bytea END,
			  i + 1,
			  CASE WHEN i % 2000 = 0 THEN '{"v":1,"steps":[{"name":"payment","done":true}]}'::bytea END
			FROM generate_series(0, $2 - 1) AS i`, resp, n); err != nil {
			b.Fatal(err)
		}
		if _, err := s.PG.Exec(ctx, `ANALYZE `+t); err != nil {
			b.Fatal(err)
		}
	}
	b.Logf("seeded %d records in %v", n, time.Since(start).Round(time.Millisecond))
}

func pgArray(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = "'" + strings.ReplaceAll(s, "'", "''") + "'"
	}
	return strings.Join(q, ", ")
}

// benchRow is record i of the seeded store (the PostgreSQL seed's SQL
// says the same).
func benchRow(i int, now time.Time, resp []byte) (state int, token string, lease, exp time.Time, body, cp []byte) {
	exp = now.Add(time.Duration(i%86400) * time.Second)
	if i%100 == 1 {
		exp = now.Add(-time.Minute)
	}
	if i%1000 == 0 {
		lease = now.Add(-time.Minute)
		if i%3000 == 0 {
			lease = now.Add(time.Hour)
		}
		if i%2000 == 0 {
			cp = []byte(`{"v":1,"steps":[{"name":"payment","done":true}]}`)
		}
		return 1, "tok" + strconv.Itoa(i), lease, exp, nil, cp
	}
	return 2, "", time.Time{}, exp, resp, nil
}

// BenchmarkPages times every console page over a store of
// IDEM_CONSOLE_BENCH_RECORDS records, on SQLite and PostgreSQL, through the
// console's handler (no network). IDEM_CONSOLE_BENCH_DIR keeps the SQLite
// file between runs.
func BenchmarkPages(b *testing.B) {
	n := benchRecords(b)
	for _, be := range []struct {
		name string
		open func(b *testing.B) *backend.Store
	}{
		{"SQLite", func(b *testing.B) *backend.Store {
			dir := os.Getenv("IDEM_CONSOLE_BENCH_DIR")
			if dir == "" {
				dir = b.TempDir()
			}
			s, err := backend.Open(context.Background(), filepath.Join(dir, fmt.Sprintf("console-bench-%d.db", n)))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			return s
		}},
		{"PostgreSQL", openBenchPG},
	} {
		b.Run(be.name, func(b *testing.B) {
			s := be.open(b)
			seedSQL(b, s, n)
			c, err := New(context.Background(), Config{Store: s, TTL: 24 * time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			h := c.Handler()
			// A session, as a browser has one.
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/", nil)
			h.ServeHTTP(rec, req)
			cookie := rec.Result().Cookies()[0]
			csrf := field(b, csrfRE, rec.Body.String())
			get := func(b *testing.B, path string, want int) string {
				req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1"+path, nil)
				req.AddCookie(cookie)
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != want {
					b.Fatalf("GET %s = %d:\n%s", path, rec.Code, rec.Body.String())
				}
				return rec.Body.String()
			}
			first := get(b, "/records?scope="+url.QueryEscape(benchScope(3)), http.StatusOK)
			next := strings.ReplaceAll(field(b, nextRE, first), "&amp;", "&")
			next = strings.ReplaceAll(next, "&#43;", "+")
			rid := RecordID(benchScope(500%benchScopes), benchKey(500))
			c.refs.remember(rid, Ref{Scope: benchScope(500 % benchScopes), Key: benchKey(500)})
			sid := RecordID(benchScope(2000%benchScopes), benchKey(2000))
			c.refs.remember(sid, Ref{Scope: benchScope(2000 % benchScopes), Key: benchKey(2000)})
			pages := []struct{ name, path string }{
				{"overview", "/"},
				{"records", "/records"},
				{"records/next-page", next},
				{"records/scope", "/records?scope=" + url.QueryEscape(benchScope(3))},
				{"records/in-flight", "/records?state=in-flight"},
				{"records/suspended", "/records?state=suspended"},
				{"records/completed", "/records?state=completed"},
				{"records/expired", "/records?state=expired"},
				{"records/older-than-12h", "/records?older=12h"},
				{"records/limit-500", "/records?limit=500"},
				{"record/completed", "/records/" + rid},
				{"record/suspended", "/records/" + sid},
				{"confirm/delete", "/records/" + rid + "/delete"},
			}
			for _, p := range pages {
				b.Run(p.name, func(b *testing.B) {
					for b.Loop() {
						get(b, p.path, http.StatusOK)
					}
				})
			}
			b.Run("search", func(b *testing.B) {
				form := url.Values{csrfField: {csrf}, "key": {benchKey(777)}}.Encode()
				for b.Loop() {
					req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/search", strings.NewReader(form))
					req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
					req.Header.Set("Origin", "http://127.0.0.1")
					req.AddCookie(cookie)
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					if rec.Code != http.StatusSeeOther {
						b.Fatalf("search = %d:\n%s", rec.Code, rec.Body.String())
					}
				}
			})
		})
	}
}

// openBenchPG opens a store in a fresh schema, dropped at the end.
func openBenchPG(b *testing.B) *backend.Store {
	base := envOr("IDEM_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	u, err := url.Parse(base)
	if err != nil {
		b.Fatal(err)
	}
	schema := "console_bench_" + randomName()
	q := u.Query()
	q.Set("idem_schema", schema)
	u.RawQuery = q.Encode()
	s, err := backend.Open(context.Background(), u.String())
	if err != nil {
		if os.Getenv("CI") != "" {
			b.Fatalf("PostgreSQL unreachable (CI is set): %v", err)
		}
		b.Skipf("PostgreSQL unreachable: %v", err)
	}
	b.Cleanup(func() {
		_, _ = s.PG.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		s.Close()
	})
	return s
}
