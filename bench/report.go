package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// The markers that delimit the generated section of the output file.
const (
	markBegin = "<!-- harness:begin -->"
	markEnd   = "<!-- harness:end -->"
)

// report gathers the results of a run.
type report struct {
	o       *options
	env     *env
	matrix  []sample
	elapsed time.Duration
	// sections are the other scenarios' results, in the order they ran.
	sections []section
	targets  []target
	machine  string
	// findings is the analysis written by hand (bench/FINDINGS.md),
	// included as it is.
	findings string
}

type section struct {
	Title, Body string
}

// target is one of the stated performance targets, with what was measured.
type target struct {
	Name     string
	Measured string
	Met      string // "met", "missed", "partly met", "not measured"
	// derived marks targets computed from the matrix when rendering.
	derived bool
}

func (r *report) add(title, body string) { r.sections = append(r.sections, section{title, body}) }

func (r *report) addTarget(name, measured, met string) {
	r.targets = append(r.targets, target{Name: name, Measured: measured, Met: met})
}

// saved is a run's results as written by -results and read by -from, so
// that the section can be rendered again (with new findings) without
// measuring again.
type saved struct {
	Command, Machine string
	Chart            string
	Duration         time.Duration
	Rounds, Slices   int
	Concurrency      []int
	MaxRequests      int64
	Elapsed          time.Duration
	Notes            []string
	Matrix           []sample
	Sections         []section
	Targets          []target
}

func (r *report) save() saved {
	return saved{Command: r.o.Command, Machine: r.machineDescription(), Chart: r.o.Chart, Duration: r.o.Duration, Rounds: r.o.Rounds, Slices: r.o.Slices,
		Concurrency: r.o.Concurrency, MaxRequests: r.o.MaxRequests, Elapsed: r.elapsed, Notes: r.env.notes, Matrix: r.matrix,
		Sections: r.sections, Targets: slices.DeleteFunc(slices.Clone(r.targets), func(t target) bool { return t.derived })}
}

// restore rebuilds a report from saved results, for rendering only.
func restore(s saved, o *options) *report {
	o.Command, o.Duration, o.Rounds, o.Slices, o.Concurrency, o.MaxRequests = s.Command, s.Duration, s.Rounds, s.Slices, s.Concurrency, s.MaxRequests
	if o.Chart == "" {
		o.Chart = s.Chart
	}
	return &report{o: o, env: &env{o: o, notes: s.Notes}, matrix: s.Matrix, sections: s.Sections, targets: s.Targets,
		machine: s.Machine, elapsed: s.Elapsed}
}

// agg is the aggregate of a system's samples at one concurrency.
type agg struct {
	n                int
	thr              float64
	p50, p99, p999   time.Duration
	allocs           float64
	peakKiB          uint64
	errors, requests int64
}

func median[T int64 | float64 | time.Duration](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (r *report) samples(sc, sys string, conc int) []sample {
	var out []sample
	for _, s := range r.matrix {
		if s.Scenario == sc && s.System == sys && s.Conc == conc {
			out = append(out, s)
		}
	}
	return out
}

func aggregate(ss []sample) agg {
	var a agg
	var thr, al []float64
	var p50, p99, p999 []time.Duration
	for _, s := range ss {
		thr = append(thr, s.Throughput)
		p50, p99, p999 = append(p50, s.P50), append(p99, s.P99), append(p999, s.P999)
		if s.AllocsPerReq >= 0 {
			al = append(al, s.AllocsPerReq)
		}
		a.peakKiB = max(a.peakKiB, s.PeakRSSKiB)
		a.errors += s.Errors
		a.requests += s.Requests
	}
	a.n = len(ss)
	a.thr, a.p50, a.p99, a.p999 = median(thr), median(p50), median(p99), median(p999)
	a.allocs = -1
	if len(al) > 0 {
		a.allocs = median(al)
	}
	return a
}

// ratio is the median over rounds of sys's throughput divided by base's in
// the same round: pairing by round cancels drifting outside load. ok is
// false when the two were not measured together.
func (r *report) ratio(sc, sys, base string, conc int) (float64, bool) {
	a, b := r.samples(sc, sys, conc), r.samples(sc, base, conc)
	var rs []float64
	for _, x := range a {
		for _, y := range b {
			if x.Round == y.Round && y.Throughput > 0 {
				rs = append(rs, x.Throughput/y.Throughput)
			}
		}
	}
	if len(rs) == 0 {
		return 0, false
	}
	return median(rs), true
}

// baseline is the system a system's throughput is compared with.
func baseline(sys string) string {
	switch sys {
	case sysFiberIdem:
		return sysFiberBare
	case sysBare, sysFiberBare:
		return ""
	}
	return sysBare
}

var systemNotes = map[string]string{
	sysBare:      "net/http handler, no idempotency",
	sysMem:       "idem middleware, memstore",
	sysSQLite:    "idem middleware, sqlitestore (file, WAL)",
	sysPG:        "idem middleware, pgstore",
	sysRedis:     "idem middleware, redisstore",
	sysRawSQLite: "handler running sqlitestore's statements, no idem logic",
	sysRawPG:     "handler running pgstore's statements, no idem logic",
	sysRawRedis:  "handler running redisstore's scripts, no idem logic",
	sysFiberBare: "Fiber v3.1.0 handler (fasthttp), no idempotency",
	sysFiberIdem: "Fiber v3.1.0 `middleware/idempotency` (memory storage)",
}

func fmtInt(f float64) string {
	s := strconv.FormatInt(int64(f+0.5), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// markdown renders the generated section.
func (r *report) markdown() string {
	var b bytes.Buffer
	o := r.o
	fmt.Fprintf(&b, "## Harness results\n\n")
	fmt.Fprintf(&b, "Generated by `bench/` (%s, %s of measuring). Produced from the repository root by:\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 UTC"), r.elapsed.Round(time.Second))
	fmt.Fprintf(&b, "```\n%s\n```\n\n", o.Command)
	b.WriteString(r.machineDescription())
	fmt.Fprintf(&b, "\n**Method.** Closed-loop load over loopback from a Go load generator (N workers, each sending its next request as soon as its previous answer arrived; keep-alive connections, a tuned `http.Transport` with `MaxIdleConnsPerHost` ≥ N). Each measurement runs %v (or at most %s requests), cut into %d slice(s) that interleave with the other systems' slices (each slice after an untimed warm-up of 2 requests per worker). Every system runs in a process of its own; in each of %d round(s) every system is measured once, in an order rotated every slice, so that outside load falls on all alike. Tables show the **median over rounds**; a ratio is the median of the per-round ratios (system ÷ its baseline measured in the same round). Latencies are per request, client side, nearest-rank percentiles. *allocs/req* is the server process's `runtime.MemStats.Mallocs` delta divided by the requests served; *peak RSS* is the server process's largest VmRSS sampled every 50 ms during the measurement. The request body is %d bytes of JSON; the answer is a 201 with a %d-byte JSON body. idem runs with `Requirement: KeyOptional` (so requests without a key pass through) and otherwise default settings.\n\n",
		o.Duration, fmtInt(float64(o.MaxRequests)), max(1, o.Slices), o.Rounds, len(bodyA), len(appResponsePrefix)+4)
	b.WriteString("Systems:\n\n")
	seen := map[string]bool{}
	for _, s := range r.matrix {
		seen[s.System] = true
	}
	for _, sys := range []string{sysBare, sysMem, sysSQLite, sysPG, sysRedis, sysRawSQLite, sysRawPG, sysRawRedis, sysFiberBare, sysFiberIdem} {
		if seen[sys] {
			fmt.Fprintf(&b, "- `%s`: %s\n", sys, systemNotes[sys])
		}
	}
	b.WriteString("\n")
	if len(r.env.notes) > 0 {
		for _, n := range r.env.notes {
			fmt.Fprintf(&b, "> %s\n", n)
		}
		b.WriteString("\n")
	}
	// The comparisons decide targets, which are listed first.
	var cmp bytes.Buffer
	r.targets = slices.DeleteFunc(r.targets, func(t target) bool { return t.derived })
	r.comparisonTables(&cmp)
	if len(r.targets) > 0 {
		b.WriteString("### Targets\n\n| target | measured (this run) | verdict |\n|---|---|---|\n")
		for _, t := range r.targets {
			fmt.Fprintf(&b, "| %s | %s | **%s** |\n", t.Name, t.Measured, t.Met)
		}
		b.WriteString("\n")
	}
	if o.Chart != "" && len(r.matrix) > 0 {
		b.WriteString("![Throughput relative to the bare handler](benchmarks.png)\n\n")
	}
	if f := strings.TrimSpace(r.findings); f != "" {
		b.WriteString(f + "\n\n")
	}
	for _, p := range pathOrder {
		r.pathTables(&b, p)
	}
	b.Write(cmp.Bytes())
	for _, s := range r.sections {
		fmt.Fprintf(&b, "### %s\n\n%s\n", s.Title, strings.TrimSpace(s.Body))
		b.WriteString("\n")
	}
	return strings.TrimRight(b.String(), "\n") + "\n"
}

func (r *report) systemsOf(sc string) []string {
	var out []string
	for _, sys := range pathSystems[sc] {
		for _, s := range r.matrix {
			if s.Scenario == sc && s.System == sys {
				out = append(out, sys)
				break
			}
		}
	}
	return out
}

// pathTables writes the throughput and latency tables of a request path.
func (r *report) pathTables(b *bytes.Buffer, sc string) {
	systems := r.systemsOf(sc)
	if len(systems) == 0 {
		return
	}
	concs := r.o.Concurrency
	fmt.Fprintf(b, "### %s\n\n", pathTitles[sc])
	switch sc {
	case scConflict:
		b.WriteString("A slow request holds one key for the whole measurement; every worker sends a duplicate and gets 409 (`bare` answers the same request with 201: it is the cost of a request that does nothing). ")
	case scMismatch:
		b.WriteString("The key was completed with one payload; every worker sends another payload with it and gets 422 (`bare`: the same request answered 201). ")
	case scReplay:
		b.WriteString("Each worker replays its own completed key (Fiber: its cache hit). ")
	case scFirst:
		b.WriteString("Every request carries a new key: claim, run the handler, store the response. ")
	}
	b.WriteString("Throughput in requests/s, and in brackets its ratio to the baseline (`bare`; for `fiber-idem`, `fiber-bare`).\n\n")
	b.WriteString("| system |")
	for _, c := range concs {
		fmt.Fprintf(b, " %d workers |", c)
	}
	b.WriteString(" allocs/req | peak RSS MiB |\n|---|")
	for range concs {
		b.WriteString("---:|")
	}
	b.WriteString("---:|---:|\n")
	for _, sys := range systems {
		fmt.Fprintf(b, "| `%s` |", sys)
		var allocs []float64
		var peak uint64
		for _, c := range concs {
			a := aggregate(r.samples(sc, sys, c))
			if a.n == 0 {
				b.WriteString(" – |")
				continue
			}
			cell := fmtInt(a.thr)
			if base := baseline(sys); base != "" {
				if q, ok := r.ratio(sc, sys, base, c); ok {
					cell += fmt.Sprintf(" (%.2f)", q)
				}
			}
			fmt.Fprintf(b, " %s |", cell)
			if a.allocs >= 0 {
				allocs = append(allocs, a.allocs)
			}
			peak = max(peak, a.peakKiB)
		}
		al := "–"
		if len(allocs) > 0 {
			al = strconv.FormatFloat(median(allocs), 'f', 0, 64)
		}
		fmt.Fprintf(b, " %s | %.0f |\n", al, float64(peak)/1024)
	}
	b.WriteString("\nLatency p50 / p99 / p99.9 in ms:\n\n| system |")
	for _, c := range concs {
		fmt.Fprintf(b, " %d workers |", c)
	}
	b.WriteString("\n|---|")
	for range concs {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, sys := range systems {
		fmt.Fprintf(b, "| `%s` |", sys)
		for _, c := range concs {
			a := aggregate(r.samples(sc, sys, c))
			if a.n == 0 {
				b.WriteString(" – |")
				continue
			}
			fmt.Fprintf(b, " %s / %s / %s |", fmtDur(a.p50), fmtDur(a.p99), fmtDur(a.p999))
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
}

// storePairs are the idem systems and the raw loops they are held to.
var storePairs = [][2]string{{sysSQLite, sysRawSQLite}, {sysPG, sysRawPG}, {sysRedis, sysRawRedis}}

// comparisonTables writes idem vs the raw store loops and idem vs Fiber,
// and records the targets they decide.
func (r *report) comparisonTables(b *bytes.Buffer) {
	concs := r.o.Concurrency
	header := func(first string) {
		fmt.Fprintf(b, "| %s |", first)
		for _, c := range concs {
			fmt.Fprintf(b, " %d workers |", c)
		}
		b.WriteString("\n|---|")
		for range concs {
			b.WriteString("---:|")
		}
		b.WriteString("\n")
	}
	// idem vs raw.
	var rows []string
	met, total := 0, 0
	var worst float64 = 1e9
	worstAt := ""
	for _, sc := range []string{scFirst, scReplay} {
		for _, pr := range storePairs {
			line := fmt.Sprintf("| %s: `%s` ÷ `%s` |", sc, pr[0], pr[1])
			any := false
			for _, c := range concs {
				q, ok := r.ratio(sc, pr[0], pr[1], c)
				if !ok {
					line += " – |"
					continue
				}
				any = true
				total++
				mark := ""
				if q >= 0.9 {
					met++
				} else {
					mark = " ✗"
				}
				if q < worst {
					worst, worstAt = q, fmt.Sprintf("%s, %s, %d workers", sc, pr[0], c)
				}
				line += fmt.Sprintf(" %.2f%s |", q, mark)
			}
			if any {
				rows = append(rows, line)
			}
		}
	}
	if len(rows) > 0 {
		b.WriteString("### idem vs the raw store loops\n\nThroughput of idem on each store as a fraction of the same HTTP handler making the same store round trips itself (target ≥ 0.9; ✗ marks a miss).\n\n")
		header("path: system ÷ raw")
		for _, l := range rows {
			b.WriteString(l + "\n")
		}
		b.WriteString("\n")
		r.targets = append(r.targets, target{"Every store's idem path ≥ 0.9 of the raw store loop (first execution and replay)",
			fmt.Sprintf("%d of %d (path, store, concurrency) cells ≥ 0.9; lowest %.2f (%s)", met, total, worst, worstAt), verdict(met, total), true})
	}
	// Replay on memstore vs bare.
	met, total = 0, 0
	var vals []string
	for _, c := range concs {
		if q, ok := r.ratio(scReplay, sysMem, sysBare, c); ok {
			total++
			if q >= 0.85 {
				met++
			}
			vals = append(vals, fmt.Sprintf("%.2f @%d", q, c))
		}
	}
	if total > 0 {
		r.targets = append([]target{{"Replay on memstore ≥ 0.85 of the bare handler's throughput", strings.Join(vals, ", "), verdict(met, total), true}}, r.targets...)
	}
	// idem vs Fiber: overhead over the own bare baseline.
	var frows []string
	met, total = 0, 0
	for _, sc := range []string{scNoKey, scFirst, scReplay} {
		line := fmt.Sprintf("| %s: idem / Fiber |", sc)
		any := false
		for _, c := range concs {
			qi, ok1 := r.ratio(sc, sysMem, sysBare, c)
			qf, ok2 := r.ratio(sc, sysFiberIdem, sysFiberBare, c)
			if !ok1 || !ok2 {
				line += " – |"
				continue
			}
			any = true
			total++
			oi, of := 1-qi, 1-qf
			mark := ""
			if oi < of {
				met++
			} else {
				mark = " ✗"
			}
			line += fmt.Sprintf(" %+.0f%% / %+.0f%%%s |", 100*oi, 100*of, mark)
		}
		if any {
			frows = append(frows, line)
		}
	}
	if len(frows) > 0 {
		b.WriteString("### Overhead: idem vs Fiber's idempotency middleware\n\nOverhead = 1 − (throughput with the middleware ÷ throughput of the same framework's bare handler, same round): idem on memstore over net/http, Fiber's middleware over Fiber. Lower is better; ✗ marks a cell where idem's overhead is not lower. What each does per request differs: idem parses and echoes the key, fingerprints the canonicalised body, leases and renews the claim, stores status, filtered headers and body, answers 409/422 with problem+json, and sets `Idempotency-Replayed`/`Idempotency-Key-Expires-At`; Fiber's middleware looks the key up, takes a per-key lock, stores the response under the key, and neither fingerprints the payload (a reused key with another payload gets the old response) nor answers 409 (a duplicate waits on the lock).\n\n")
		header("path: idem / Fiber overhead")
		for _, l := range frows {
			b.WriteString(l + "\n")
		}
		b.WriteString("\n")
		r.targets = append(r.targets, target{"Overhead over the own bare baseline lower than Fiber's idempotency middleware",
			fmt.Sprintf("idem lower in %d of %d (path, concurrency) cells", met, total), verdict(met, total), true})
	}
}

func verdict(met, total int) string {
	switch {
	case total == 0:
		return "not measured"
	case met == total:
		return "met"
	case met == 0:
		return "missed"
	}
	return "partly met"
}

// machineDescription describes the machine, toolchain and servers.
func (r *report) machineDescription() string {
	if r.machine != "" {
		return r.machine
	}
	var b strings.Builder
	cpu := "unknown"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if name, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(name) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	mem := "unknown"
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
				mem = fmt.Sprintf("%.1f GiB", kb/1024/1024)
			}
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Fprintf(&b, "**Machine.** CPU: %s, %d cores (`runtime.NumCPU`); memory: %s; Linux %s; %s %s/%s. ",
		cpu, runtime.NumCPU(), mem, strings.TrimSpace(string(kernel)), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r.env.pgOK {
		if conn, err := pgx.Connect(ctx, r.o.PGURL); err == nil {
			var v string
			if conn.QueryRow(ctx, "SHOW server_version").Scan(&v) == nil {
				fmt.Fprintf(&b, "PostgreSQL %s", v)
			}
			var fsync, sc string
			if conn.QueryRow(ctx, "SELECT current_setting('fsync'), current_setting('synchronous_commit')").Scan(&fsync, &sc) == nil {
				fmt.Fprintf(&b, " (fsync=%s, synchronous_commit=%s)", fsync, sc)
			}
			b.WriteString(", ")
			conn.Close(ctx)
		}
	}
	if r.env.redOK {
		if opts, err := redis.ParseURL(r.o.RedisURL); err == nil {
			rc := redis.NewClient(opts)
			if info, err := rc.Info(ctx, "server").Result(); err == nil {
				for _, line := range strings.Split(info, "\n") {
					if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
						fmt.Fprintf(&b, "Redis %s, ", v)
					}
				}
			}
			_ = rc.Close()
		}
	}
	fmt.Fprintf(&b, "both on the same host over loopback; load average at the end of the run: %s. The machine is shared with other work: compare within this run only.\n",
		strings.Join(strings.Fields(string(load))[:min(3, len(strings.Fields(string(load))))], " "))
	r.machine = b.String()
	return r.machine
}

// replaceSection rewrites the part of the file between the harness markers.
func replaceSection(path, section string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := spliceSection(data, section)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, out, 0o644)
}

// spliceSection returns doc with the text between the markers replaced by
// section, leaving everything outside them as it was.
func spliceSection(doc []byte, section string) ([]byte, error) {
	i := bytes.Index(doc, []byte(markBegin))
	j := bytes.Index(doc, []byte(markEnd))
	if i < 0 || j < 0 || j < i {
		return nil, errors.New("the markers " + markBegin + " and " + markEnd + " are missing or out of order")
	}
	var out bytes.Buffer
	out.Write(doc[:i+len(markBegin)])
	out.WriteString("\n")
	out.WriteString(section)
	out.Write(doc[j:])
	return out.Bytes(), nil
}

// merge combines saved runs: a later run's matrix samples, sections and
// targets replace those of the same scenario, title or name in an earlier
// one, and the command lines are kept in order.
func merge(runs []saved) saved {
	if len(runs) == 0 {
		return saved{}
	}
	m := runs[0]
	for _, r := range runs[1:] {
		m.Command += "\n" + r.Command
		m.Elapsed += r.Elapsed
		m.Notes = append(m.Notes, r.Notes...)
		scen := map[string]bool{}
		for _, s := range r.Matrix {
			scen[s.Scenario] = true
		}
		if len(scen) > 0 {
			m.Matrix = slices.DeleteFunc(m.Matrix, func(s sample) bool { return scen[s.Scenario] })
			m.Matrix = append(m.Matrix, r.Matrix...)
			m.Duration, m.Rounds, m.Slices, m.Concurrency, m.MaxRequests = r.Duration, r.Rounds, r.Slices, r.Concurrency, r.MaxRequests
		}
		for _, sec := range r.Sections {
			if i := slices.IndexFunc(m.Sections, func(x section) bool { return x.Title == sec.Title }); i >= 0 {
				m.Sections[i] = sec
			} else {
				m.Sections = append(m.Sections, sec)
			}
		}
		for _, t := range r.Targets {
			if i := slices.IndexFunc(m.Targets, func(x target) bool { return x.Name == t.Name }); i >= 0 {
				m.Targets[i] = t
			} else {
				m.Targets = append(m.Targets, t)
			}
		}
		m.Machine = r.Machine
	}
	return m
}
