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
// chooses from its statistics: checked on a seeded, analysed table). On
// PostgreSQL, which has no in-flight index (pgstore migration 5), the
// in-flight listing and counts read the table but stop at their LIMIT;
// with the optional index docs/console.md names, they read that index.
func TestListingPlans(t *testing.T) {
	t.Parallel()
	now := time.Now()
	queries := []planCase{
		{name: "all", q: Query{Limit: 50}, index: "pkey"},
		{name: "scope", q: Query{Scope: "s", Limit: 50}, index: "pkey"},
		{name: "completed", q: Query{State: StateCompleted, Limit: 50}, index: "pkey"},
		{name: "in flight", q: Query{State: StateInFlight, Limit: 50}, index: "inflight", pg: "table"},
		{name: "suspended", q: Query{State: StateSuspended, Limit: 50}, index: "inflight", pg: "checkpoint"},
		{name: "held", q: Query{State: StateHeld, Limit: 50}, index: "inflight", pg: "checkpoint"},
		{name: "expired", q: Query{State: StateExpired, Limit: 50}, index: "expires_at"},
		{name: "age", q: Query{Before: now.Add(time.Hour), Limit: 50}, index: "expires_at"},
		{name: "next page", q: Query{Limit: 50, After: &Cursor{Scope: "s", Key: "k"}}, index: "pkey"},
		{name: "next in-flight page", q: Query{State: StateInFlight, Limit: 50, After: &Cursor{Sort: now.UnixNano(), Scope: "s", Key: "k"}}, index: "inflight", pg: "table"},
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
		cases := append(queries, summaryQueries(src.summarySQL(now))...)
		plan := func(t *testing.T, c planCase) (string, []string) {
			stmt, args := c.stmt, c.args
			if stmt == "" {
				stmt, args, _, _ = src.listSQL(c.q, now)
			}
			rows, err := s.PG.Query(context.Background(), "EXPLAIN "+stmt, args...)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			defer rows.Close()
			var plan []string
			for rows.Next() {
				var line string
				if err := rows.Scan(&line); err != nil {
					t.Fatal(err)
				}
				plan = append(plan, strings.TrimSpace(line))
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			return strings.Join(plan, "\n"), plan
		}
		for _, c := range cases {
			p, lines := plan(t, c)
			index := c.index
			if c.pg != "" {
				index = c.pg
			}
			if index == "table" {
				// No index lists the records in flight: the statement
				// reads the table, and its LIMIT bounds what it keeps
				// (a top-N sort) and returns.
				if !strings.Contains(p, "Limit  (") {
					t.Errorf("%s: plan\n%s\nwant a LIMIT", c.name, p)
				}
				continue
			}
			want := map[string]string{"pkey": "_pkey", "checkpoint": "_checkpoint_idx", "expires_at": "_expires_at_brin"}[index]
			sorts := false
			for _, l := range lines {
				sorts = sorts || strings.HasPrefix(strings.TrimLeft(l, "-> "), "Sort  (")
			}
			// The expiry index is a BRIN index (pgstore version 4): it
			// reads the block ranges that may hold the rows asked for,
			// which the listing then sorts; it never reads the table. The
			// checkpoint index is partial (pgstore version 5): the listing
			// sorts the records holding a recovery point, never the table.
			sorts = sorts && index != "expires_at" && index != "checkpoint"
			if !strings.Contains(p, want) || sorts || strings.Contains(p, "Seq Scan") {
				t.Errorf("%s: plan\n%s\nwant the %s index without a full sort or a sequential scan", c.name, p, want)
			}
		}
		// The optional in-flight index (docs/console.md): the same
		// statements read it instead of the table.
		table := s.Records.(*pgstore.Store).Table()
		if _, err := s.PG.Exec(context.Background(), "CREATE INDEX idempotency_records_inflight_idx ON "+table+
			" (lease_expires_at, scope, key) WHERE token IS NOT NULL"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PG.Exec(context.Background(), "ANALYZE "+table); err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			if c.pg != "table" {
				continue
			}
			if p, _ := plan(t, c); !strings.Contains(p, "_inflight_idx") || strings.Contains(p, "Seq Scan") {
				t.Errorf("%s with the optional in-flight index: plan\n%s\nwant that index without a sequential scan", c.name, p)
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
	// pg is the index on PostgreSQL when it is another one: "checkpoint",
	// or "table" for a read of the table bounded by its LIMIT.
	pg   string
	stmt string
	args []any
}

func summaryQueries(sum [4]statement) []planCase {
	cases := []planCase{
		{name: "summary in flight", index: "inflight", pg: "table", stmt: sum[0].stmt, args: sum[0].args},
		{name: "summary expired", index: "expires_at", stmt: sum[1].stmt, args: sum[1].args},
		{name: "summary oldest lease", index: "inflight", pg: "table", stmt: sum[2].stmt, args: sum[2].args},
	}
	if sum[3].stmt != "" {
		cases = append(cases, planCase{name: "summary in flight with the oldest", pg: "table", stmt: sum[3].stmt, args: sum[3].args})
	}
	return cases
}
