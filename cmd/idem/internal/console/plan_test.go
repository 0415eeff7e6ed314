package console

import (
	"context"

	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemhq/idem/pgstore"
)

// Each listing is served by the index docs/console.md names, on SQLite
// (whose planner the queries direct) and on PostgreSQL (whose planner
// chooses from its statistics: checked on a seeded, analysed table).
func TestListingPlans(t *testing.T) {
	t.Parallel()
	now := time.Now()
	queries := []planCase{
		{name: "all", q: Query{Limit: 50}, index: "pkey"},
		{name: "scope", q: Query{Scope: "s", Limit: 50}, index: "pkey"},
		{name: "completed", q: Query{State: StateCompleted, Limit: 50}, index: "pkey"},
		{name: "in flight", q: Query{State: StateInFlight, Limit: 50}, index: "inflight"},
		{name: "suspended", q: Query{State: StateSuspended, Limit: 50}, index: "inflight"},
		{name: "held", q: Query{State: StateHeld, Limit: 50}, index: "inflight"},
		{name: "expired", q: Query{State: StateExpired, Limit: 50}, index: "expires_at"},
		{name: "age", q: Query{Before: now.Add(time.Hour), Limit: 50}, index: "expires_at"},
		{name: "next page", q: Query{Limit: 50, After: &Cursor{Scope: "s", Key: "k"}}, index: "pkey"},
		{name: "next in-flight page", q: Query{State: StateInFlight, Limit: 50, After: &Cursor{Sort: now.UnixNano(), Scope: "s", Key: "k"}}, index: "inflight"},
	}
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		s := openStore(t, filepath.Join(t.TempDir(), "r.db"))
		seedSQL(t, s, 20_000) // an empty table gets other plans
		src := newSQLiteSource(s.SQLite)
		sum := src.summarySQL(now)
		for _, c := range append(queries, summaryQueries(sum)...) {
			stmt, args := c.stmt, c.args
			if stmt == "" {
				stmt, args, _, _ = src.listSQL(c.q, now)
			}
			rows, err := s.SQLite.ReadDB().Query("EXPLAIN QUERY PLAN "+stmt, args...)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			var plan []string
			for rows.Next() {
				var id, parent, unused int
				var detail string
				if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, detail)
			}
			rows.Close()
			p := strings.Join(plan, "; ")
			want := "idem_records_" + c.index
			if c.index == "pkey" {
				want = "idem_records" // SCAN or SEARCH of the table itself: its primary key
			}
			if !strings.Contains(p, want) || c.index == "pkey" && strings.Contains(p, "INDEX") || strings.Contains(p, "TEMP B-TREE") {
				t.Errorf("%s: plan %q, want the %s without a sort", c.name, p, c.index)
			}
		}
	})
	t.Run("PostgreSQL", func(t *testing.T) {
		t.Parallel()
		s := backends[1].open(t)
		seedSQL(t, s, 50_000)
		src := newPGSource(s.Records.(*pgstore.Store), s.PG)
		sum := src.summarySQL(now)
		for _, c := range append(queries, summaryQueries(sum)...) {
			stmt, args := c.stmt, c.args
			if stmt == "" {
				stmt, args, _, _ = src.listSQL(c.q, now)
			}
			rows, err := s.PG.Query(context.Background(), "EXPLAIN "+stmt, args...)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			var plan []string
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, strings.TrimSpace(line))
			}
			rows.Close()
			p := strings.Join(plan, "\n")
			want := map[string]string{"pkey": "_pkey", "inflight": "_inflight_idx", "expires_at": "_expires_at_brin"}[c.index]
			sorts := false
			for _, l := range plan {
				sorts = sorts || strings.HasPrefix(strings.TrimLeft(l, "-> "), "Sort  (")
			}
			// The expiry index is a BRIN index (pgstore version 4): it
			// reads the block ranges that may hold the rows asked for,
			// which the listing then sorts; it never reads the table.
			sorts = sorts && c.index != "expires_at"
			// The in-flight index is partial (token IS NOT NULL): with few
			// records in flight the planner may read it as a bitmap and
			// sort what it found, which costs the in-flight set, never the
			// table. That choice depends on when autovacuum analysed the
			// table, so it is allowed.
			sorts = sorts && !(c.index == "inflight" && strings.Contains(p, "Bitmap Index Scan on idempotency_records_inflight_idx"))
			if !strings.Contains(p, want) || sorts || strings.Contains(p, "Seq Scan") {
				t.Errorf("%s: plan\n%s\nwant the %s index without a full sort or a sequential scan", c.name, p, want)
			}
		}
	})
}

// planCase is a query whose plan TestListingPlans checks: a listing, or
// a statement (stmt set).
type planCase struct {
	name  string
	q     Query
	index string // the index's name suffix; "pkey" for the primary key
	stmt  string
	args  []any
}

func summaryQueries(sum [3]statement) []planCase {
	return []planCase{
		{name: "summary in flight", index: "inflight", stmt: sum[0].stmt, args: sum[0].args},
		{name: "summary expired", index: "expires_at", stmt: sum[1].stmt, args: sum[1].args},
		{name: "summary oldest lease", index: "inflight", stmt: sum[2].stmt, args: sum[2].args},
	}
}
