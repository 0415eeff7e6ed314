// Command bench is idem's benchmark harness. From the repository root,
//
//	go run ./bench -duration 10s -out docs/BENCHMARKS.md
//
// measures idem against the bare net/http handler and against Fiber v3's
// idempotency middleware,
// over loopback with a closed-loop load generator, alternating the systems
// in every round so that the noise of a shared machine falls on all of
// them alike. It rewrites the generated section of docs/BENCHMARKS.md
// (between the harness markers) and the chart docs/benchmarks.png.
//
// Every system runs in a process of its own (this binary's hidden
// serve-system and plain-payments subcommands), so that its allocations and
// memory are measured apart from the load generator's. PostgreSQL and
// Redis come from IDEM_TEST_POSTGRES_URL and IDEM_TEST_REDIS_URL (the
// machine's defaults otherwise); each run uses fresh schemas, a fresh
// database and a fresh key prefix, and removes them at the end.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Defaults of the servers, as in the tests of the store modules.
const (
	defaultPGURL    = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	defaultRedisURL = "redis://127.0.0.1:6379/0"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// dispatch runs the harness or one of its hidden subcommands.
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		var err error
		switch args[0] {
		case "serve-system":
			err = runServeSystem(ctx, args[1:])
		case "plain-payments":
			err = runPlainPayments(ctx, args[1:])
		default:
			return runHarness(ctx, args, stdout, stderr)
		}
		if err != nil {
			fmt.Fprintf(stderr, "bench %s: %v\n", args[0], err)
			return 1
		}
		return 0
	}
	return runHarness(ctx, args, stdout, stderr)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// parseOptions parses the harness's flags.
func parseOptions(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := &options{}
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "duration of each measurement")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds: every system is measured once per round, in rotating order")
	fs.IntVar(&o.Slices, "slices", 4, "slices each matrix measurement is cut into, interleaved with the other systems' slices")
	conc := fs.String("concurrency", "1,8,32,128", "comma-separated closed-loop worker counts")
	serveConc := fs.String("serve-concurrency", "16", "comma-separated keep-alive client counts of the serve scenario")
	fs.StringVar(&o.ServeBackends, "serve-backends", "", "comma-separated databases of the serve scenario, by the first word of their\nname, case-insensitive (sqlite, postgresql, mariadb, redis; default all)")
	fs.DurationVar(&o.ServeDuration, "serve-duration", 3*time.Second, "length of each slice of the serve scenario")
	scen := fs.String("scenarios", "", "comma-separated scenarios to run (default all): "+strings.Join(allScenarios, ","))
	fs.StringVar(&o.Out, "out", "", "Markdown file whose generated section is rewritten (default: print the section)")
	fs.StringVar(&o.Chart, "chart", "", "PNG chart to write (default: beside -out, benchmarks.png)")
	fs.BoolVar(&o.Quick, "quick", false, "a fast run: short measurements, one round, small tables")
	fs.Int64Var(&o.MaxRequests, "max-requests", 3_000_000, "bound on the requests of one measurement")
	fs.IntVar(&o.ScaleRows, "scale-rows", 10_000_000, "records in the large table of the scale scenario")
	fs.IntVar(&o.SmallRows, "small-rows", 10_000, "records in the small table of the scale scenario")
	fs.IntVar(&o.MemKeys, "mem-keys", 1_000_000, "unique keys of the memory scenario")
	fs.IntVar(&o.CleanupRows, "cleanup-rows", 1_000_000, "expired records of the cleanup scenario")
	fs.IntVar(&o.ScaleConcurrency, "scale-concurrency", 8, "workers of the scale scenario")
	fs.IntVar(&o.CleanupConcurrency, "cleanup-concurrency", 8, "workers of the cleanup scenario's traffic")
	fs.StringVar(&o.Findings, "findings", "", "Markdown analysis included in the section (default: bench/FINDINGS.md under -repo, if present)")
	fs.StringVar(&o.ProfileDir, "profile-dir", "", "record a perf CPU profile of the server process of every measurement into this directory")
	fs.StringVar(&o.Repo, "repo", "", "repository root (default: the directory holding go.work, from the working directory up)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.Quick {
		if !set["duration"] {
			o.Duration = 300 * time.Millisecond
		}
		if !set["serve-duration"] {
			o.ServeDuration = o.Duration
		}
		if !set["rounds"] {
			o.Rounds = 1
		}
		if !set["concurrency"] {
			*conc = "1,8"
		}
		if !set["scale-rows"] {
			o.ScaleRows = 100_000
		}
		if !set["small-rows"] {
			o.SmallRows = 1_000
		}
		if !set["mem-keys"] {
			o.MemKeys = 50_000
		}
		if !set["cleanup-rows"] {
			o.CleanupRows = 20_000
		}
	}
	if o.Quick && !set["serve-concurrency"] {
		*serveConc = *conc
	}
	for _, f := range strings.Split(*serveConc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 4096 {
			return nil, fmt.Errorf("-serve-concurrency: %q is not a client count", f)
		}
		o.ServeConcurrency = append(o.ServeConcurrency, n)
	}
	if o.ServeDuration <= 0 {
		return nil, fmt.Errorf("-serve-duration must be positive")
	}
	if o.ServeBackends != "" {
		for _, want := range strings.Split(o.ServeBackends, ",") {
			known := false
			for _, bd := range serveBackends {
				known = known || strings.EqualFold(strings.TrimSpace(want), serveBackendWord(bd.name))
			}
			if !known {
				return nil, fmt.Errorf("-serve-backends: unknown database %q (known: sqlite, postgresql, mariadb, redis)", want)
			}
		}
	}
	for _, f := range strings.Split(*conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 4096 {
			return nil, fmt.Errorf("-concurrency: %q is not a worker count", f)
		}
		o.Concurrency = append(o.Concurrency, n)
	}
	if *scen != "" {
		o.Scenarios = map[string]bool{}
		for _, s := range strings.Split(*scen, ",") {
			s = strings.TrimSpace(s)
			known := false
			for _, a := range allScenarios {
				known = known || a == s
			}
			if !known {
				return nil, fmt.Errorf("-scenarios: unknown scenario %q (known: %s)", s, strings.Join(allScenarios, ","))
			}
			o.Scenarios[s] = true
		}
	}
	if o.Duration <= 0 || o.Rounds < 1 || o.Slices < 1 || o.SmallRows < 1 || o.ScaleRows < o.SmallRows || o.MemKeys < 1 || o.CleanupRows < 1 {
		return nil, fmt.Errorf("-duration, -rounds and the row counts must be positive (and -scale-rows at least -small-rows)")
	}
	if o.Chart == "" && o.Out != "" {
		o.Chart = filepath.Join(filepath.Dir(o.Out), "benchmarks.png")
	}
	if o.Repo == "" {
		o.Repo = findRepo()
	}
	if o.Findings == "" {
		o.Findings = filepath.Join(o.Repo, "bench", "FINDINGS.md")
	}
	o.PGURL = envOr("IDEM_TEST_POSTGRES_URL", defaultPGURL)
	o.RedisURL = envOr("IDEM_TEST_REDIS_URL", defaultRedisURL)
	o.MySQLDSN = envOr("IDEM_TEST_MYSQL_URL", defaultMySQLURL)
	o.Strict = os.Getenv("CI") != ""
	o.Command = "go run ./bench " + strings.Join(args, " ")
	return o, nil
}

// findRepo returns the nearest directory, from the working directory up,
// that holds go.work.
func findRepo() string {
	dir, err := os.Getwd()
	if err != nil {
		return "."
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.work")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

func runHarness(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 2
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	o.Exe = exe
	o.Log = stderr
	rep, err := run(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	if o.Out == "" {
		fmt.Fprint(stdout, rep)
	}
	return 0
}

// run runs every selected scenario and writes the report (and chart); it
// returns the generated section.
func run(ctx context.Context, o *options) (string, error) {
	e, err := newEnv(ctx, o)
	if err != nil {
		return "", err
	}
	defer e.cleanup(context.WithoutCancel(ctx))
	started := time.Now()
	rep := &report{o: o, env: e}
	if rep.matrix, err = e.runMatrix(ctx); err != nil {
		return "", err
	}
	for _, sc := range []struct {
		name string
		fn   func(context.Context, *report) error
	}{{scScale, e.runScale}, {scMemory, e.runMemory}, {scCleanup, e.runCleanup}, {scServe, e.runServe}, {scCheck, e.runCheck}} {
		if !o.want(sc.name) {
			continue
		}
		o.logf("scenario %s", sc.name)
		if err := sc.fn(ctx, rep); err != nil {
			return "", fmt.Errorf("%s: %w", sc.name, err)
		}
	}
	rep.elapsed = time.Since(started)
	return render(rep)
}

// render writes the section (and chart) of a report.
func render(rep *report) (string, error) {
	o := rep.o
	if data, err := os.ReadFile(o.Findings); err == nil {
		rep.findings = string(data)
	}
	section := rep.markdown()
	if o.Out != "" {
		if err := replaceSection(o.Out, section); err != nil {
			return "", err
		}
	}
	if o.Chart != "" && len(rep.matrix) > 0 {
		if err := writeChart(o.Chart, rep); err != nil {
			return "", fmt.Errorf("chart: %w", err)
		}
	}
	return section, nil
}
