package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// options configure a harness run.
type options struct {
	Duration    time.Duration
	Rounds      int
	Concurrency []int
	// ServeConcurrency and ServeDuration are the client counts and the
	// slice length of the serve scenario (default 16 clients, 3 s).
	ServeConcurrency []int
	ServeDuration    time.Duration
	// Scenarios selects the scenarios to run; empty: all.
	Scenarios map[string]bool
	Out       string
	Chart     string
	Quick     bool
	// MaxRequests bounds each measurement.
	MaxRequests int64
	// ScaleRows is the large table of the scale scenario (10 million);
	// SmallRows the small one (10 thousand).
	ScaleRows, SmallRows int
	// MemKeys is the number of unique keys of the memory scenario;
	// CleanupRows the expired records of the cleanup scenario (1 million).
	MemKeys, CleanupRows int
	// Slices is the number of interleaved slices each matrix measurement
	// is cut into.
	Slices int
	// ScaleConcurrency and CleanupConcurrency are the concurrency of
	// those scenarios' traffic.
	ScaleConcurrency, CleanupConcurrency int
	PGURL, RedisURL                      string
	// MySQLDSN is the MariaDB server, a go-sql-driver DSN.
	MySQLDSN string
	// ServeBackends selects the serve scenario's databases by the first
	// word of their names (see serveBackend); empty: all.
	ServeBackends string
	// Repo is the repository root, where cmd/idem is built from.
	Repo string
	// Exe is the binary that serves systems (this program, or a test
	// binary that dispatches the subcommands).
	Exe string
	// Command is the command line, as recorded in the report.
	Command string
	// Strict makes unreachable servers an error instead of a skip.
	Strict bool
	// Log receives progress lines.
	Log io.Writer
	// Findings: see the -findings flag.
	Findings string
	// ProfileDir, if set, receives a perf CPU profile of the server
	// process of every measurement.
	ProfileDir string
}

// The scenarios.
const (
	scNoKey    = "nokey"
	scFirst    = "first"
	scReplay   = "replay"
	scConflict = "conflict"
	scMismatch = "mismatch"
	scScale    = "scale"
	scMemory   = "memory"
	scCleanup  = "cleanup"
	scServe    = "serve"
	scCheck    = "check"
)

var allScenarios = []string{scNoKey, scFirst, scReplay, scConflict, scMismatch, scScale, scMemory, scCleanup, scServe, scCheck}

func (o *options) want(sc string) bool { return len(o.Scenarios) == 0 || o.Scenarios[sc] }

func (o *options) logf(format string, args ...any) {
	if o.Log != nil {
		fmt.Fprintf(o.Log, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
}

// env is the shared state of a run: the servers, and the records created
// in them, removed by cleanup.
type env struct {
	o      *options
	runID  string
	tmp    string
	pgOK   bool
	pgErr  string
	redOK  bool
	redErr string
	myOK   bool

	mu       sync.Mutex
	schemas  []string
	dbs      []string
	prefixes []string
	children []*child
	notes    []string
	keySeq   atomic.Uint64
}

func newEnv(ctx context.Context, o *options) (*env, error) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	e := &env{o: o, runID: hex.EncodeToString(b[:])}
	tmp, err := os.MkdirTemp("", "idem-bench-")
	if err != nil {
		return nil, err
	}
	e.tmp = tmp
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if conn, err := pgx.Connect(pctx, o.PGURL); err != nil {
		e.pgErr = err.Error()
	} else {
		e.pgOK = conn.Ping(pctx) == nil
		conn.Close(pctx)
	}
	if err := mysqlReachable(pctx, o.MySQLDSN); err != nil {
		e.note("MariaDB unreachable (%s): its systems were skipped.", err)
	} else {
		e.myOK = true
	}
	ropts, err := redis.ParseURL(o.RedisURL)
	if err != nil {
		return nil, err
	}
	rc := redis.NewClient(ropts)
	if err := rc.Ping(pctx).Err(); err != nil {
		e.redErr = err.Error()
	} else {
		e.redOK = true
	}
	_ = rc.Close()
	if o.Strict && (!e.pgOK || !e.redOK) {
		e.cleanup(context.Background())
		return nil, fmt.Errorf("servers unreachable (CI is set): postgres: %s; redis: %s", e.pgErr, e.redErr)
	}
	if !e.pgOK {
		e.note("PostgreSQL unreachable (%s): its systems were skipped.", e.pgErr)
	}
	if !e.redOK {
		e.note("Redis unreachable (%s): its systems were skipped.", e.redErr)
	}
	return e, nil
}

func (e *env) note(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.notes = append(e.notes, fmt.Sprintf(format, args...))
	e.o.logf("note: "+format, args...)
}

// schema returns a fresh PostgreSQL schema name, dropped by cleanup.
func (e *env) schema(what string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := fmt.Sprintf("idem_bench_%s_%s", e.runID, what)
	e.schemas = append(e.schemas, s)
	return s
}

// prefix returns a fresh Redis key prefix, whose keys cleanup deletes.
func (e *env) prefix(what string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := fmt.Sprintf("idem-bench:%s:%s:", e.runID, what)
	e.prefixes = append(e.prefixes, p)
	return p
}

// database creates a fresh PostgreSQL database, dropped by cleanup, and
// returns its URL.
func (e *env) database(ctx context.Context, what string) (string, error) {
	name := fmt.Sprintf("idem_bench_%s_%s", e.runID, what)
	conn, err := pgx.Connect(ctx, e.o.PGURL)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	e.mu.Lock()
	e.dbs = append(e.dbs, name)
	e.mu.Unlock()
	cfg, err := pgx.ParseConfig(e.o.PGURL)
	if err != nil {
		return "", err
	}
	u := strings.Replace(e.o.PGURL, "/"+cfg.Database, "/"+name, 1)
	return u, nil
}

// start starts a serve-system process for a system.
func (e *env) start(ctx context.Context, system string, extra ...string) (*child, error) {
	args := append([]string{"serve-system", "-system", system}, extra...)
	c, err := startChild(ctx, system, e.o.Exe, args...)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.children = append(e.children, c)
	e.mu.Unlock()
	return c, nil
}

// systemArgs returns the serve-system flags that give a system fresh
// records: its own SQLite file, PostgreSQL schema or Redis prefix.
func (e *env) systemArgs(system, tag string) []string {
	switch system {
	case sysSQLite:
		return []string{"-sqlite", filepath.Join(e.tmp, system+"-"+tag+".db")}
	case sysPG:
		return []string{"-pg", e.o.PGURL, "-pg-schema", e.schema(strings.ReplaceAll(system, "-", "_") + "_" + tag)}
	case sysRedis:
		return []string{"-redis", e.o.RedisURL, "-redis-prefix", e.prefix(system + ":" + tag)}
	}
	return nil
}

// available reports whether a system's server is reachable.
func (e *env) available(system string) bool {
	switch system {
	case sysPG:
		return e.pgOK
	case sysRedis:
		return e.redOK
	}
	return true
}

// cleanup stops every process and removes every record the run created.
func (e *env) cleanup(ctx context.Context) {
	for _, c := range e.children {
		c.stop()
	}
	e.children = nil
	if e.pgOK && (len(e.schemas) > 0 || len(e.dbs) > 0) {
		if conn, err := pgx.Connect(ctx, e.o.PGURL); err == nil {
			for _, s := range e.schemas {
				if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize()+" CASCADE"); err != nil {
					e.o.logf("drop schema %s: %v", s, err)
				}
			}
			for _, d := range e.dbs {
				if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{d}.Sanitize()+" WITH (FORCE)"); err != nil {
					e.o.logf("drop database %s: %v", d, err)
				}
			}
			conn.Close(ctx)
		}
	}
	if e.redOK && len(e.prefixes) > 0 {
		if ropts, err := redis.ParseURL(e.o.RedisURL); err == nil {
			rc := redis.NewClient(ropts)
			for _, p := range e.prefixes {
				if err := deletePrefix(ctx, rc, p); err != nil {
					e.o.logf("delete redis keys %s*: %v", p, err)
				}
			}
			_ = rc.Close()
		}
	}
	_ = os.RemoveAll(e.tmp)
}

// deletePrefix deletes the keys starting with prefix, with SCAN and
// UNLINK: never FLUSHDB, the server is shared.
func deletePrefix(ctx context.Context, rc *redis.Client, prefix string) error {
	var cursor uint64
	for {
		keys, next, err := rc.Scan(ctx, cursor, prefix+"*", 1000).Result()
		if err != nil {
			return err
		}
		if len(keys) > 0 {
			if err := rc.Unlink(ctx, keys...).Err(); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// newKey returns a fresh idempotency key in the UUID shape (36
// characters), quoted as a Structured Field string.
func (e *env) newKey() string {
	n := e.keySeq.Add(1)
	return fmt.Sprintf(`"%s-%04x-4000-a000-%012x"`, e.runID, (n>>48)&0xffff, n&0xffffffffffff)
}

// Bodies: the payment request (about 100 bytes, as the core's targets
// specify) and a different payload for the 422 path.
var (
	bodyA = []byte(`{"amountCents":2599,"currency":"USD","reference":"order-1001","customer":"cus_8e03978e40d5","x":123}`)
	bodyB = []byte(`{"amountCents":9999,"currency":"USD","reference":"order-1001","customer":"cus_8e03978e40d5","x":123}`)
)

// sample is one measurement of one system.
type sample struct {
	Scenario, System string
	Conc, Round      int
	Throughput       float64
	P50, P99, P999   time.Duration
	AllocsPerReq     float64 // -1: not measured
	PeakRSSKiB       uint64
	Requests, Errors int64
	FirstError       string
}

// pathSystems lists the systems measured on each request path.
var pathSystems = map[string][]string{
	scNoKey:    {sysBare, sysMem, sysFiberBare, sysFiberIdem},
	scFirst:    {sysBare, sysMem, sysSQLite, sysPG, sysRedis, sysFiberBare, sysFiberIdem},
	scReplay:   {sysBare, sysMem, sysSQLite, sysPG, sysRedis, sysFiberBare, sysFiberIdem},
	scConflict: {sysBare, sysMem, sysSQLite, sysPG, sysRedis},
	scMismatch: {sysBare, sysMem, sysSQLite, sysPG, sysRedis},
}

var pathOrder = []string{scNoKey, scFirst, scReplay, scConflict, scMismatch}

var pathTitles = map[string]string{
	scNoKey:    "No key (pass-through)",
	scFirst:    "First execution (a new key per request)",
	scReplay:   "Replay (same key, completed)",
	scConflict: "409 under contention (one key held by a slow request)",
	scMismatch: "422 (used key, other payload)",
}

// runMatrix measures every request path on every system at every
// concurrency, alternating the systems inside each round.
func (e *env) runMatrix(ctx context.Context) ([]sample, error) {
	var paths []string
	for _, p := range pathOrder {
		if e.o.want(p) {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return nil, nil
	}
	// One process per system, for the whole matrix.
	need := map[string]bool{}
	for _, p := range paths {
		for _, s := range pathSystems[p] {
			need[s] = true
		}
	}
	procs := map[string]*child{}
	clients := map[string]*http.Client{}
	maxConc := slices.Max(e.o.Concurrency)
	for _, s := range sortedKeys(need) {
		if !e.available(s) {
			continue
		}
		c, err := e.start(ctx, s, e.systemArgs(s, "matrix")...)
		if err != nil {
			return nil, err
		}
		procs[s] = c
		clients[s] = newClient(maxConc)
	}
	var out []sample
	for _, p := range paths {
		for _, conc := range e.o.Concurrency {
			var systems []string
			for _, s := range pathSystems[p] {
				if procs[s] != nil {
					systems = append(systems, s)
				}
			}
			for r := range e.o.Rounds {
				// Each system's measurement is cut into slices, and the
				// systems' slices interleave, so that a burst of outside
				// load falls on all of them alike. The order rotates every
				// slice: no system always runs first, right after a rest,
				// or right after a heavy one.
				parts := map[string][]part{}
				dur := e.o.Duration / time.Duration(e.o.Slices)
				for j := range e.o.Slices {
					order := slices.Clone(systems)
					k := (r*e.o.Slices + j) % len(order)
					order = append(order[k:], order[:k]...)
					for _, s := range order {
						pt, err := e.measure(ctx, p, s, procs[s], clients[s], conc, r, dur)
						if err != nil {
							return out, fmt.Errorf("%s on %s, %d workers: %w", p, s, conc, err)
						}
						parts[s] = append(parts[s], pt)
					}
				}
				for _, s := range systems {
					sm := combine(p, s, conc, r, parts[s])
					if float64(sm.Errors) > 0.01*float64(sm.Requests) {
						return out, fmt.Errorf("%s on %s, %d workers: %d of %d requests failed, first: %s", p, s, conc, sm.Errors, sm.Requests, sm.FirstError)
					}
					e.o.logf("%-8s %-11s c=%-3d r=%d %9.0f req/s  p50 %7s  p99 %7s  allocs/req %5.0f  errors %d %s",
						p, s, conc, r, sm.Throughput, fmtDur(sm.P50), fmtDur(sm.P99), sm.AllocsPerReq, sm.Errors, sm.FirstError)
					out = append(out, sm)
				}
			}
		}
	}
	for _, c := range procs {
		if _, hwm := rssKiB(c.pid()); hwm > 0 {
			e.o.logf("%s: peak RSS over the matrix %d MiB", c.name, hwm/1024)
		}
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// measure runs one measurement of a path on a system.
// part is one slice of a measurement.
type part struct {
	res     loadResult
	mallocs uint64
	allocOK bool
	peakKiB uint64
}

// combine merges the slices of one system's measurement in one round.
func combine(path, system string, conc, round int, parts []part) sample {
	var all loadResult
	var mallocs uint64
	allocOK := true
	var peak uint64
	for _, p := range parts {
		all.Requests += p.res.Requests
		all.Errors += p.res.Errors
		all.Elapsed += p.res.Elapsed
		all.Latencies = append(all.Latencies, p.res.Latencies...)
		if all.FirstError == "" {
			all.FirstError = p.res.FirstError
		}
		mallocs += p.mallocs
		allocOK = allocOK && p.allocOK
		peak = max(peak, p.peakKiB)
	}
	slices.Sort(all.Latencies)
	allocs := -1.0
	if allocOK && all.Requests > 0 {
		allocs = float64(mallocs) / float64(all.Requests)
	}
	return sample{Scenario: path, System: system, Conc: conc, Round: round, Throughput: all.Throughput(),
		P50: all.Percentile(0.50), P99: all.Percentile(0.99), P999: all.Percentile(0.999),
		AllocsPerReq: allocs, PeakRSSKiB: peak, Requests: all.Requests, Errors: all.Errors, FirstError: all.FirstError}
}

// measure runs one slice of a measurement of a path on a system.
func (e *env) measure(ctx context.Context, path, system string, c *child, client *http.Client, conc, round int, dur time.Duration) (part, error) {
	isBare := system == sysBare || system == sysFiberBare
	url := c.url(pathPayments)
	spec := loadSpec{Workers: conc, Duration: dur, MaxRequests: e.o.MaxRequests, Warmup: 2, Status: http.StatusCreated}
	var after func() error
	switch path {
	case scNoKey:
		spec.Req = func(w, i int) request { return request{method: "POST", url: url, body: bodyA} }
	case scFirst:
		spec.Req = func(w, i int) request {
			rq := request{method: "POST", url: url, body: bodyA}
			if !isBare {
				rq.key = e.newKey()
			}
			return rq
		}
	case scReplay:
		keys := make([]string, conc)
		for i := range keys {
			keys[i] = e.newKey()
		}
		// The warm-up's first request executes; every later one replays.
		spec.Req = func(w, i int) request {
			rq := request{method: "POST", url: url, body: bodyA}
			if !isBare {
				rq.key = keys[w]
			}
			return rq
		}
	case scMismatch:
		key := e.newKey()
		if !isBare {
			st, err := doRequest(ctx, client, request{method: "POST", url: url, body: bodyA, key: key}, nil)
			if err != nil || st != http.StatusCreated {
				return part{}, fmt.Errorf("completing the key: status %d, %v", st, err)
			}
			spec.Status = http.StatusUnprocessableEntity
		}
		spec.Req = func(w, i int) request {
			rq := request{method: "POST", url: url, body: bodyB}
			if !isBare {
				rq.key = key
			}
			return rq
		}
	case scConflict:
		if isBare {
			spec.Req = func(w, i int) request { return request{method: "POST", url: url, body: bodyA} }
			break
		}
		key := e.newKey()
		slow := c.url(pathSlow)
		held := make(chan error, 1)
		go func() {
			st, err := doRequest(context.WithoutCancel(ctx), client, request{method: "POST", url: slow, body: bodyA, key: key}, nil)
			if err == nil && st != http.StatusCreated {
				err = fmt.Errorf("the slow request answered %d", st)
			}
			held <- err
		}()
		// Wait until the slow request holds the key: its handler runs,
		// so its claim is made, and every duplicate now gets 409.
		if _, err := c.control("POST", "/await-slow"); err != nil {
			return part{}, fmt.Errorf("the slow request was never held: %w", err)
		}
		spec.Status = http.StatusConflict
		spec.Req = func(w, i int) request { return request{method: "POST", url: slow, body: bodyA, key: key} }
		after = func() error {
			if _, err := c.control("POST", "/release"); err != nil {
				return err
			}
			return <-held
		}
	}
	var before stats
	var sampler *rssSampler
	var stErr error
	stopProfile := func() {}
	spec.Started = func() {
		before, stErr = c.control("GET", "/stats")
		sampler = sampleRSS(c.pid())
		stopProfile = e.profile(ctx, c, fmt.Sprintf("%s-%s-c%d-r%d", path, system, conc, round))
	}
	res := runLoad(ctx, client, spec)
	stopProfile()
	peak := uint64(0)
	if sampler != nil {
		peak = sampler.finish()
	}
	pt := part{res: res, peakKiB: peak}
	if afterSt, err := c.control("GET", "/stats"); err == nil && stErr == nil {
		pt.mallocs, pt.allocOK = afterSt.Mallocs-before.Mallocs, true
	}
	if after != nil {
		if err := after(); err != nil {
			return part{}, fmt.Errorf("releasing the slow request: %w", err)
		}
	}
	if res.Requests == 0 {
		return part{}, fmt.Errorf("no request measured: %s", res.FirstError)
	}
	if res.Errors > 0 && float64(res.Errors) > 0.01*float64(res.Requests) {
		return part{}, fmt.Errorf("%d of %d requests failed, first: %s (server: %s)", res.Errors, res.Requests, res.FirstError, c.stderr.String())
	}
	return pt, nil
}

func fmtDur(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case ms >= 100:
		return strconv.FormatFloat(ms, 'f', 0, 64)
	case ms >= 10:
		return strconv.FormatFloat(ms, 'f', 1, 64)
	case ms >= 1:
		return strconv.FormatFloat(ms, 'f', 2, 64)
	}
	return strconv.FormatFloat(ms, 'f', 3, 64)
}
