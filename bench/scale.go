package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// loadOn runs one measurement against a child and returns it as a sample,
// with the child's allocations when it has a control server.
func (e *env) loadOn(ctx context.Context, c *child, client *http.Client, spec loadSpec, label string) (sample, error) {
	var before stats
	var sampler *rssSampler
	stErr := fmt.Errorf("no control server")
	stopProfile := func() {}
	spec.Started = func() {
		if c.ctl != "" {
			before, stErr = c.control("GET", "/stats")
		}
		sampler = sampleRSS(c.pid())
		stopProfile = e.profile(ctx, c, label)
	}
	if spec.MaxRequests == 0 {
		spec.MaxRequests = e.o.MaxRequests
	}
	res := runLoad(ctx, client, spec)
	stopProfile()
	var peak uint64
	if sampler != nil {
		peak = sampler.finish()
	}
	allocs := -1.0
	if stErr == nil && res.Requests > 0 {
		if after, err := c.control("GET", "/stats"); err == nil {
			allocs = float64(after.Mallocs-before.Mallocs) / float64(res.Requests)
		}
	}
	if res.Requests == 0 {
		return sample{}, fmt.Errorf("%s: no request measured: %s (server: %s)", c.name, res.FirstError, c.stderr.String())
	}
	if float64(res.Errors) > 0.01*float64(res.Requests) {
		return sample{}, fmt.Errorf("%s: %d of %d requests failed, first: %s (server: %s)", c.name, res.Errors, res.Requests, res.FirstError, c.stderr.String())
	}
	return sample{System: c.name, Conc: spec.Workers, Throughput: res.Throughput(), P50: res.Percentile(0.5), P99: res.Percentile(0.99),
		P999: res.Percentile(0.999), AllocsPerReq: allocs, PeakRSSKiB: peak, Requests: res.Requests, Errors: res.Errors, FirstError: res.FirstError}, nil
}

// bulkRecord is what the bulk loads store in every record: the record the
// middleware itself would have stored for bodyA, so that a retry of a bulk
// key with bodyA replays it.
type bulkRecord struct {
	scope, fingerprint string
	response           []byte
}

func newBulkRecord() (bulkRecord, error) {
	fp, err := idem.Fingerprint(idem.FingerprintInput{Method: "POST", Operation: patternCreate, Target: pathPayments,
		ContentType: "application/json", Body: bodyA})
	if err != nil {
		return bulkRecord{}, err
	}
	body := fmt.Appendf(append([]byte{}, appResponsePrefix...), "%d}", len(bodyA))
	resp := &idemstore.Response{StatusCode: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: body}
	enc, err := resp.MarshalBinary()
	if err != nil {
		return bulkRecord{}, err
	}
	return bulkRecord{scope: idem.Scope("", patternCreate), fingerprint: fp, response: enc}, nil
}

const bulkBatch = 1_000_000

// bulkKey is the key of bulk record i.
func bulkKey(i int) string { return fmt.Sprintf(`"bulk-%09d"`, i) }

// loadSQLite bulk-loads n records into a sqlitestore file, with recursive
// CTEs, in transactions of a million rows. expired records have a
// retention that ended in the last day; the others expire in a day.
func (e *env) loadSQLite(ctx context.Context, path string, n int, expired bool) (time.Duration, error) {
	s, err := sqlitestore.Open(ctx, path, nil)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	rec, err := newBulkRecord()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	now := time.Now().UnixNano()
	expiry := fmt.Sprintf("%d", time.Now().Add(24*time.Hour).UnixNano())
	if expired {
		expiry = fmt.Sprintf("%d - (1 + i %% 86400) * 1000000000", now)
	}
	for from := 0; from < n; from += bulkBatch {
		to := min(n, from+bulkBatch)
		q := `INSERT INTO ` + sqlitestore.DefaultTable + ` (scope, key, fingerprint, state, token, lease_until, expires_at, response)
			WITH RECURSIVE seq(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < ?)
			SELECT ?, printf('bulk-%09d', i), ?, 2, NULL, 0, ` + expiry + `, ? FROM seq`
		if _, err := s.DB().ExecContext(ctx, q, from, to, rec.scope, rec.fingerprint, rec.response); err != nil {
			return 0, fmt.Errorf("sqlite bulk load: %w", err)
		}
		e.o.logf("  sqlite %s: %d / %d records", filepath.Base(path), to, n)
	}
	if _, err := s.DB().ExecContext(ctx, "PRAGMA wal_checkpoint(TRUNCATE)"); err != nil {
		return 0, err
	}
	if _, err := s.DB().ExecContext(ctx, "ANALYZE"); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// loadPG bulk-loads n records into a pgstore schema with generate_series,
// in statements of a million rows, then VACUUM ANALYZE.
func (e *env) loadPG(ctx context.Context, schema string, n int, expired bool) (time.Duration, error) {
	pool, err := pgxpool.New(ctx, e.o.PGURL)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	if _, err := pgstore.New(ctx, pool, &pgstore.Config{Schema: schema}); err != nil {
		return 0, err
	}
	rec, err := newBulkRecord()
	if err != nil {
		return 0, err
	}
	table := pgx.Identifier{schema, pgstore.DefaultTable}.Sanitize()
	expiry := "now() + interval '1 day'"
	if expired {
		expiry = "now() - interval '1 second' * (1 + i % 86400)"
	}
	start := time.Now()
	for from := 0; from < n; from += bulkBatch {
		to := min(n, from+bulkBatch)
		q := `INSERT INTO ` + table + ` (scope, key, fingerprint, token, lease_expires_at, expires_at, attempt, response)
			SELECT $1, 'bulk-' || lpad(i::text, 9, '0'), $2, NULL, NULL, ` + expiry + `, 1, $3
			FROM generate_series($4::bigint, $5::bigint) AS i`
		if _, err := pool.Exec(ctx, q, rec.scope, rec.fingerprint, rec.response, from, to-1); err != nil {
			return 0, fmt.Errorf("postgres bulk load: %w", err)
		}
		e.o.logf("  postgres %s: %d / %d records", schema, to, n)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE "+table); err != nil {
		return 0, err
	}
	// Flush the load's dirty pages now, so that the checkpoint they would
	// cause does not fall on the measurements.
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		e.o.logf("CHECKPOINT after the bulk load: %v (the measurements may overlap the next checkpoint)", err)
	}
	return time.Since(start), nil
}

// runScale measures claim (first execution) and replay latency with a
// small and a large table, on SQLite and PostgreSQL.
func (e *env) runScale(ctx context.Context, r *report) error {
	type store struct {
		name, system string
		ok           bool
	}
	stores := []store{{"SQLite", sysSQLite, true}, {"PostgreSQL", sysPG, e.pgOK}}
	sizes := []int{e.o.SmallRows, e.o.ScaleRows}
	conc := e.o.ScaleConcurrency
	var b strings.Builder
	fmt.Fprintf(&b, "Claim (first execution, a new random key per request) and replay (a random one of the loaded, completed records per request) with %s and with %s records in the store's own table, bulk-loaded with SQL (a recursive CTE for SQLite, `generate_series` for PostgreSQL; keys `bulk-000000000`…, so the primary-key index is built in order). %d workers, %v per measurement, %d round(s) alternating the two tables. Medians over rounds.\n\n",
		fmtInt(float64(sizes[0])), fmtInt(float64(sizes[1])), conc, e.o.Duration, e.o.Rounds)
	b.WriteString("| store | path | records | load time | req/s | p50 ms | p99 ms | p99.9 ms | p99 large ÷ small |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	var within, total int
	var worst float64
	var worstAt string
	var scaleNotes []string
	for _, st := range stores {
		if !st.ok {
			continue
		}
		var procs [2]*child
		var loadTime [2]time.Duration
		var schemas [2]string
		for i, n := range sizes {
			tag := fmt.Sprintf("scale%d", i)
			var args []string
			var err error
			switch st.system {
			case sysSQLite:
				path := filepath.Join(e.tmp, tag+".db")
				loadTime[i], err = e.loadSQLite(ctx, path, n, false)
				args = []string{"-sqlite", path}
			case sysPG:
				schema := e.schema(tag)
				schemas[i] = schema
				loadTime[i], err = e.loadPG(ctx, schema, n, false)
				args = []string{"-pg", e.o.PGURL, "-pg-schema", schema}
			}
			if err != nil {
				return err
			}
			if procs[i], err = e.start(ctx, st.system, args...); err != nil {
				return err
			}
		}
		client := newClient(conc)
		var pgc *pgx.Conn
		var hits, reads [2]int64
		if st.system == sysPG {
			var err error
			if pgc, err = pgx.Connect(ctx, e.o.PGURL); err != nil {
				return err
			}
			defer pgc.Close(context.WithoutCancel(ctx))
		}
		for _, path := range []string{scFirst, scReplay} {
			var res [2][]sample
			for round := range e.o.Rounds {
				for k := range 2 {
					i := (k + round) % 2
					n := sizes[i]
					url := procs[i].url(pathPayments)
					spec := loadSpec{Workers: conc, Duration: e.o.Duration, Warmup: 2, Status: http.StatusCreated}
					if path == scFirst {
						spec.Req = func(w, j int) request { return request{method: "POST", url: url, body: bodyA, key: e.newKey()} }
					} else {
						spec.Req = func(w, j int) request {
							return request{method: "POST", url: url, body: bodyA, key: bulkKey(rand.IntN(n))}
						}
					}
					var h0, r0 int64
					if pgc != nil && path == scReplay {
						h0, r0 = blockStats(ctx, pgc, schemas[i])
					}
					sm, err := e.loadOn(ctx, procs[i], client, spec, fmt.Sprintf("scale-%s-%s-%d-r%d", st.name, path, n, round))
					if err != nil {
						return err
					}
					if pgc != nil && path == scReplay {
						h1, r1 := blockStats(ctx, pgc, schemas[i])
						hits[i] += h1 - h0
						reads[i] += r1 - r0
					}
					e.o.logf("scale %s %s %d records: %.0f req/s p99 %s", st.name, path, n, sm.Throughput, fmtDur(sm.P99))
					res[i] = append(res[i], sm)
				}
			}
			var a [2]agg
			for i := range 2 {
				a[i] = aggregate(res[i])
			}
			q := float64(a[1].p99) / float64(a[0].p99)
			total++
			if q <= 1.5 {
				within++
			}
			if q > worst {
				worst, worstAt = q, st.name+" "+path
			}
			for i := range 2 {
				cell := ""
				if i == 1 {
					cell = fmt.Sprintf("**%.2f**", q)
				}
				fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", st.name, path, fmtInt(float64(sizes[i])),
					loadTime[i].Round(time.Second), fmtInt(a[i].thr), fmtDur(a[i].p50), fmtDur(a[i].p99), fmtDur(a[i].p999), cell)
			}
		}
		for _, p := range procs {
			p.stop()
		}
		if pgc != nil {
			var size int64
			var sb string
			_ = pgc.QueryRow(ctx, "SELECT pg_total_relation_size($1), current_setting('shared_buffers')",
				pgx.Identifier{schemas[1], pgstore.DefaultTable}.Sanitize()).Scan(&size, &sb)
			pct := func(i int) float64 { return 100 * float64(hits[i]) / float64(max(1, hits[i]+reads[i])) }
			note := fmt.Sprintf("PostgreSQL: during the replay measurements %.1f%% (%s records) and %.1f%% (%s records) of the records table's heap and index block accesses were found in shared_buffers (`pg_statio_user_tables`, whose counters lag up to a second); the large table and its indexes take %d MiB, against shared_buffers = %s on this server.",
				pct(0), fmtInt(float64(sizes[0])), pct(1), fmtInt(float64(sizes[1])), size>>20, sb)
			if pct(1) < 95 {
				note += " Most random replays on the large table therefore copy index and heap pages in from the operating system's page cache."
			}
			scaleNotes = append(scaleNotes, note)
		}
	}
	if total > 0 {
		for _, n := range scaleNotes {
			b.WriteString("\n" + n + "\n")
		}
		r.add(fmt.Sprintf("Scale: %s vs %s stored records", fmtInt(float64(sizes[0])), fmtInt(float64(sizes[1]))), b.String())
		r.addTarget(fmt.Sprintf("p99 with %s records within 1.5x of p99 with %s", fmtInt(float64(sizes[1])), fmtInt(float64(sizes[0]))),
			fmt.Sprintf("%d of %d (store, path) within; largest ratio %.2f (%s)", within, total, worst, worstAt), verdict(within, total))
	}
	return nil
}

// runMemory measures memstore's heap after MemKeys unique keys through the
// middleware, in this process, and reports on the idem proxy process.
func (e *env) runMemory(ctx context.Context, r *report) error {
	var b strings.Builder
	n := e.o.MemKeys
	store, err := memstore.New(&memstore.Config{MaxRecords: n + 1})
	if err != nil {
		return err
	}
	mw, err := idem.NewMiddleware(store, &idem.Config{Logger: quietLogger})
	if err != nil {
		return err
	}
	h := mw.Handle(http.HandlerFunc(appHandler))
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	w := &discard{h: http.Header{}}
	for i := range n {
		req, _ := http.NewRequestWithContext(ctx, "POST", "http://bench"+pathPayments, strings.NewReader(string(bodyA)))
		req.Pattern = patternCreate
		req.Header["Content-Type"] = []string{"application/json"}
		req.Header["Idempotency-Key"] = []string{fmt.Sprintf(`"%s-mem-%012d"`, e.runID, i)}
		clear(w.h)
		h.ServeHTTP(w, req)
		if w.status != http.StatusCreated {
			return fmt.Errorf("memory: request %d answered %d", i, w.status)
		}
	}
	took := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	if store.Len() != n {
		return fmt.Errorf("memory: memstore holds %d records, want %d", store.Len(), n)
	}
	heap := float64(after.HeapInuse) - float64(before.HeapInuse)
	runtime.KeepAlive(store)
	fmt.Fprintf(&b, "memstore, after %s unique keys through the middleware (each record: %d-byte fingerprint, the 201 response with its `Content-Type` and a %d-byte body), in one process, after a GC: **%.0f MiB** of heap in use more than before (%.0f bytes per record); filling it took %v (%.0f requests/s through `ServeHTTP`, no network).\n\n",
		fmtInt(float64(n)), len("v1:")+64, len(appResponsePrefix)+4, heap/(1<<20), heap/float64(n), took.Round(time.Millisecond), float64(n)/took.Seconds())
	// The idem proxy process, in front of the bare handler, with records
	// in its memory.
	if err := e.proxyMemory(ctx, &b, n); err != nil {
		return err
	}
	r.add("Memory after "+fmtInt(float64(n))+" unique keys", b.String())
	return nil
}

// discard is a ResponseWriter that keeps only the status.
type discard struct {
	h      http.Header
	status int
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) WriteHeader(s int)           { d.status = s }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }

// runCleanup measures DeleteExpired of CleanupRows expired records in
// batches while first-execution traffic runs on the same store, against
// the same traffic alone before and after.
func (e *env) runCleanup(ctx context.Context, r *report) error {
	var b strings.Builder
	n, conc, batch := e.o.CleanupRows, e.o.CleanupConcurrency, 1000
	fmt.Fprintf(&b, "%s expired, completed records are bulk-loaded into the store's table; %d workers send first executions (new keys) through idem for %v (before), then while the server process itself (as a service's cleanup loop, such as `idem serve`'s) deletes the expired records with `DeleteExpired` in batches of %d until none is left (during), then for %v again (after).\n\n",
		fmtInt(float64(n)), conc, e.o.Duration, batch, e.o.Duration)
	b.WriteString("| store | phase | req/s | p50 ms | p99 ms | p99.9 ms | deletion |\n|---|---|---:|---:|---:|---:|---|\n")
	measured := false
	for _, st := range []struct {
		name, system string
		ok           bool
	}{{"SQLite", sysSQLite, true}, {"PostgreSQL", sysPG, e.pgOK}} {
		if !st.ok {
			continue
		}
		var args []string
		switch st.system {
		case sysSQLite:
			path := filepath.Join(e.tmp, "cleanup.db")
			if _, err := e.loadSQLite(ctx, path, n, true); err != nil {
				return err
			}
			args = []string{"-sqlite", path}
		case sysPG:
			schema := e.schema("cleanup")
			if _, err := e.loadPG(ctx, schema, n, true); err != nil {
				return err
			}
			args = []string{"-pg", e.o.PGURL, "-pg-schema", schema}
		}
		c, err := e.start(ctx, st.system, args...)
		if err != nil {
			return err
		}
		client := newClient(conc)
		url := c.url(pathPayments)
		spec := loadSpec{Workers: conc, Duration: e.o.Duration, Warmup: 2, Status: http.StatusCreated,
			Req: func(w, i int) request { return request{method: "POST", url: url, body: bodyA, key: e.newKey()} }}
		beforeS, err := e.loadOn(ctx, c, client, spec, "")
		if err != nil {
			return err
		}
		// The server process deletes, with its own store, as a service's
		// cleanup loop does.
		done := make(chan struct{})
		type delRes struct {
			deletion
			err error
		}
		dres := make(chan delRes, 1)
		go func() {
			defer close(done)
			var d delRes
			d.err = c.controlJSON(ctx, &http.Client{}, "POST", fmt.Sprintf("/delete-expired?batch=%d", batch), &d.deletion)
			dres <- d
		}()
		during := spec
		during.Duration = 30 * time.Minute
		during.Stop = done
		duringS, err := e.loadOn(ctx, c, client, during, "cleanup-during-"+st.name)
		d := <-dres
		if err != nil {
			return err
		}
		if d.err != nil {
			return fmt.Errorf("cleanup: DeleteExpired: %w", d.err)
		}
		afterS, err := e.loadOn(ctx, c, client, spec, "")
		c.stop()
		if err != nil {
			return err
		}
		for i, s := range []sample{beforeS, duringS, afterS} {
			phase := []string{"traffic alone, before", "**with DeleteExpired**", "traffic alone, after"}[i]
			note := ""
			if i == 1 {
				note = fmt.Sprintf("%s records in %v (%d calls, %s records/s)", fmtInt(float64(d.Deleted)), d.Took.Round(time.Millisecond), d.Calls, fmtInt(float64(d.Deleted)/d.Took.Seconds()))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", st.name, phase, fmtInt(s.Throughput), fmtDur(s.P50), fmtDur(s.P99), fmtDur(s.P999), note)
		}
		e.o.logf("cleanup %s: p99 %s alone, %s with deletion (%d deleted in %v)", st.name, fmtDur(beforeS.P99), fmtDur(duringS.P99), d.Deleted, d.Took)
		measured = true
	}
	// memstore deletes in process; no traffic, just the cost.
	ms, err := memstore.New(&memstore.Config{MaxRecords: n + 1})
	if err != nil {
		return err
	}
	past := time.Now().Add(-48 * time.Hour)
	resp := &idemstore.Response{StatusCode: 201, Body: []byte(`{}`)}
	for i := range n {
		p := idemstore.ClaimParams{Scope: "s", Key: fmt.Sprint("k", i), Fingerprint: "v1:x", Token: "t", Lease: time.Minute, TTL: 24 * time.Hour, Now: past}
		if _, err := ms.Claim(ctx, p); err != nil {
			return err
		}
		if err := ms.Complete(ctx, idemstore.CompleteParams{Scope: p.Scope, Key: p.Key, Token: "t", Response: resp, Now: past}); err != nil {
			return err
		}
	}
	start := time.Now()
	deleted := 0
	for {
		k, err := ms.DeleteExpired(ctx, idemstore.DeleteExpiredParams{Limit: batch, Now: time.Now()})
		if err != nil {
			return err
		}
		deleted += k
		if k < batch {
			break
		}
	}
	took := time.Since(start)
	fmt.Fprintf(&b, "\nmemstore (no traffic, in process): DeleteExpired removed %s expired records in batches of %d in %v (%s records/s). Redis deletes expired records itself (key expiry), so redisstore's DeleteExpired does nothing.\n",
		fmtInt(float64(deleted)), batch, took.Round(time.Millisecond), fmtInt(float64(deleted)/took.Seconds()))
	if measured || deleted > 0 {
		r.add("Cleanup: deleting "+fmtInt(float64(n))+" expired records while traffic runs", b.String())
	}
	return nil
}

// proxyMemory measures the resident memory of an `idem proxy --store
// memory` process before and after n unique keys went through it.
func (e *env) proxyMemory(ctx context.Context, b *strings.Builder, n int) error {
	bin, err := e.idemBinary(ctx)
	if err != nil {
		fmt.Fprintf(b, "`idem proxy`: not measured: cmd/idem did not build (%v).\n", err)
		return nil
	}
	out, _ := exec.CommandContext(ctx, bin, "proxy", "--help").CombinedOutput()
	if !strings.Contains(string(out), "--upstream") {
		fmt.Fprintf(b, "`idem proxy`: not measured: it does not exist in cmd/idem yet (`idem proxy --help` answers %q).\n", strings.TrimSpace(string(out)))
		e.note("idem proxy does not exist yet; its memory was not measured.")
		return nil
	}
	up, err := e.start(ctx, sysBare)
	if err != nil {
		return err
	}
	defer up.stop()
	// One client sends every request without credentials: the explicit
	// shared key space (a protected request without its scope header is
	// otherwise refused with 400 proxy.scope_missing).
	px, err := e.startIdem(ctx, bin, "proxy", "--upstream", "http://"+up.addr, "--store", "memory", "--cleanup-interval", "0", "--scope-header", "none")
	if err != nil {
		return err
	}
	defer px.stop()
	const conc = 32
	client := newClient(conc)
	url := px.url(pathPayments)
	warm := loadSpec{Workers: conc, Duration: time.Minute, MaxRequests: 1, Warmup: 1, Status: http.StatusCreated,
		Req: func(w, i int) request { return request{method: "POST", url: url, body: bodyA, key: e.newKey()} }}
	if res := runLoad(ctx, client, warm); res.Errors > 0 {
		return fmt.Errorf("idem proxy warm-up: %s (proxy: %s)", res.FirstError, px.stderr.String())
	}
	rss0, _ := rssKiB(px.pid())
	spec := warm
	spec.Warmup, spec.MaxRequests, spec.Duration = 0, int64(n), 30*time.Minute
	res := runLoad(ctx, client, spec)
	if res.Errors > 0 {
		return fmt.Errorf("idem proxy: %d errors, first: %s (proxy: %s)", res.Errors, res.FirstError, px.stderr.String())
	}
	rss1, hwm := rssKiB(px.pid())
	fmt.Fprintf(b, "`idem proxy --store memory` (built from cmd/idem, run as a process in front of the `bare` handler, `--access-log=false`): resident memory **%.0f MiB** after %s unique keys (%d workers, %.0f requests/s), %.0f MiB before them (after start-up and a warm-up); peak %.0f MiB: %.0f bytes per record of resident memory.\n",
		float64(rss1)/1024, fmtInt(float64(res.Requests)), conc, res.Throughput(), float64(rss0)/1024, float64(hwm)/1024, float64(rss1-rss0)*1024/float64(max(1, res.Requests)))
	return nil
}

// profile records a CPU profile of a server process with perf while a
// measurement runs, when -profile-dir is set, into DIR/label.perf.data
// (read it with perf report -i FILE). It returns the function that stops
// the recording.
func (e *env) profile(ctx context.Context, c *child, label string) func() {
	if e.o.ProfileDir == "" || label == "" {
		return func() {}
	}
	if err := os.MkdirAll(e.o.ProfileDir, 0o755); err != nil {
		e.o.logf("perf: %v", err)
		return func() {}
	}
	out := filepath.Join(e.o.ProfileDir, strings.NewReplacer(" ", "-", "/", "-").Replace(label)+".perf.data")
	cmd := exec.CommandContext(ctx, "perf", "record", "-F", "999", "-g", "-p", fmt.Sprint(c.pid()), "-o", out)
	stderr := &tailBuffer{max: 1024}
	cmd.Stdout, cmd.Stderr = nil, stderr
	if err := cmd.Start(); err != nil {
		e.o.logf("perf: %v", err)
		return func() {}
	}
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			if _, statErr := os.Stat(out); statErr != nil {
				e.o.logf("perf record %s: %v: %s", label, err, stderr.String())
			}
		}
	}
}

// blockStats returns the shared-buffer hits and reads of the records
// table's heap and indexes in schema, from pg_statio_user_tables.
func blockStats(ctx context.Context, c *pgx.Conn, schema string) (hits, reads int64) {
	_ = c.QueryRow(ctx, `SELECT coalesce(heap_blks_hit, 0) + coalesce(idx_blks_hit, 0), coalesce(heap_blks_read, 0) + coalesce(idx_blks_read, 0)
		FROM pg_statio_user_tables WHERE schemaname = $1 AND relname = $2`, schema, pgstore.DefaultTable).Scan(&hits, &reads)
	return hits, reads
}
