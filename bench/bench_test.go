package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestMain lets the test binary serve systems: the harness starts its
// serve-system and plain-payments processes from its own executable, which
// under go test is this binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "serve-system" || os.Args[1] == "plain-payments") {
		os.Exit(dispatch(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(leaked(m.Run()))
}

// TestSmoke runs the whole harness for a fraction of a second per
// measurement: every system of the matrix on every request path, and the
// scale, memory and cleanup scenarios on small tables (with -short; without
// it also idem serve and idem check, which build cmd/idem). PostgreSQL and
// Redis systems are skipped only when their server is unreachable and CI
// is unset; with CI set an unreachable server fails the test.
func TestSmoke(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "BENCHMARKS.md")
	doc := "# Benchmarks\n\nhand-written text\n\n" + markBegin + "\nold\n" + markEnd + "\n\nmore hand-written text\n"
	if err := os.WriteFile(out, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	scenarios := "nokey,first,replay,conflict,mismatch,scale,memory,cleanup"
	if !testing.Short() {
		scenarios += ",serve,check"
	}
	args := []string{"-quick", "-duration", "150ms", "-concurrency", "4", "-scenarios", scenarios,
		"-small-rows", "200", "-scale-rows", "2000", "-mem-keys", "2000", "-cleanup-rows", "2000",
		"-scale-concurrency", "2", "-cleanup-concurrency", "2", "-out", out, "-repo", ".."}
	o, err := parseOptions(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	o.Exe = os.Args[0]
	var log bytes.Buffer
	o.Log = &log
	if _, err := run(t.Context(), o); err != nil {
		t.Fatalf("harness: %v\n%s", err, log.String())
	}
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	text := string(got)
	if !strings.HasPrefix(text, "# Benchmarks\n\nhand-written text\n\n"+markBegin+"\n") || !strings.HasSuffix(text, markEnd+"\n\nmore hand-written text\n") {
		t.Errorf("the text outside the markers changed:\n%s", text)
	}
	if strings.Contains(text, "\nold\n") {
		t.Error("the old section was not replaced")
	}
	want := []string{"**Machine.**", "### Targets", "`bare`", "`idem-mem`", "`idem-sqlite`",
		"`fiber-bare`", "`fiber-idem`", "### Scale", "### Memory after", "### Cleanup", "Replay on memstore"}
	env, err := newEnv(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	env.cleanup(t.Context())
	if env.pgOK {
		want = append(want, "`idem-pg`")
	} else {
		t.Logf("PostgreSQL unreachable, its systems were skipped: %s", env.pgErr)
	}
	if env.redOK {
		want = append(want, "`idem-redis`")
	} else {
		t.Logf("Redis unreachable, its systems were skipped: %s", env.redErr)
	}
	if !testing.Short() {
		want = append(want, "`idem serve` vs the plain handler", "| SQLite | first |", "FAIL  payload-mismatch", "PASS  payload-mismatch")
	}
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("the section lacks %q", w)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, "benchmarks.png")); err != nil || st.Size() == 0 {
		t.Errorf("the chart was not written: %v", err)
	}
}

func TestSpliceSection(t *testing.T) {
	t.Parallel()
	doc := []byte("intro\n" + markBegin + "\nold\n" + markEnd + "\noutro\n")
	got, err := spliceSection(doc, "new\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "intro\n" + markBegin + "\nnew\n" + markEnd + "\noutro\n"; string(got) != want {
		t.Errorf("got %q, want %q", got, want)
	}
	for _, bad := range []string{"no markers", markEnd + markBegin, markBegin + " only"} {
		if _, err := spliceSection([]byte(bad), "x"); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestPercentileAndMedian(t *testing.T) {
	t.Parallel()
	var ds []time.Duration
	for i := 1; i <= 1000; i++ {
		ds = append(ds, time.Duration(i))
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 500}, {0.99, 990}, {0.999, 999}, {1, 1000}, {0.0001, 1}} {
		if got := percentile(ds, c.p); got != c.want {
			t.Errorf("percentile(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := median([]float64{3, 1, 2}); got != 2 {
		t.Errorf("median odd = %v", got)
	}
	if got := median([]float64{4, 1, 2, 3}); got != 2.5 {
		t.Errorf("median even = %v", got)
	}
}

// TestLoadIsBounded checks that a measurement stops by itself at its
// request bound and at its deadline, and counts unexpected answers.
func TestLoadIsBounded(t *testing.T) {
	t.Parallel()
	var served atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := served.Add(1)
		if r.Header.Get("Idempotency-Key") == `"bad"` && n%2 == 0 {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	c := newClient(4)
	req := func(key string) reqFunc {
		return func(w, i int) request { return request{method: "POST", url: srv.URL, body: bodyA, key: key} }
	}
	res := runLoad(t.Context(), c, loadSpec{Workers: 4, Duration: time.Minute, MaxRequests: 200, Warmup: 1, Req: req(`"k"`), Status: http.StatusCreated})
	if res.Requests != 200 || res.Errors != 0 || len(res.Latencies) != 200 {
		t.Errorf("request bound: %d requests, %d errors (%s)", res.Requests, res.Errors, res.FirstError)
	}
	if got := served.Load(); got != 204 {
		t.Errorf("server saw %d requests, want 200 + 4 warm-up", got)
	}
	start := time.Now()
	res = runLoad(t.Context(), c, loadSpec{Workers: 2, Duration: 100 * time.Millisecond, Req: req(`"k"`), Status: http.StatusCreated})
	if took := time.Since(start); took > 5*time.Second || res.Requests == 0 {
		t.Errorf("time bound: %v, %d requests", took, res.Requests)
	}
	res = runLoad(t.Context(), c, loadSpec{Workers: 1, Duration: time.Minute, MaxRequests: 10, Req: req(`"bad"`), Status: http.StatusCreated})
	if res.Errors == 0 || !strings.Contains(res.FirstError, "status 500") {
		t.Errorf("unexpected answers not counted: %d errors, %q", res.Errors, res.FirstError)
	}
	stop := make(chan struct{})
	close(stop)
	res = runLoad(t.Context(), c, loadSpec{Workers: 2, Duration: time.Minute, Stop: stop, Req: req(`"k"`), Status: http.StatusCreated})
	if res.Requests != 2 {
		t.Errorf("with a closed Stop channel, 2 workers measured %d requests, want one each", res.Requests)
	}
}

// TestServeDefaults checks the serve scenario's defaults (16 clients,
// 3-second slices, as issue 14 measures) and that -quick and the flags
// override them.
func TestServeDefaults(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args  []string
		conc  []int
		slice time.Duration
	}{
		{nil, []int{16}, 3 * time.Second},
		{[]string{"-serve-concurrency", "1,8,32,128", "-serve-duration", "2s"}, []int{1, 8, 32, 128}, 2 * time.Second},
		{[]string{"-quick", "-concurrency", "4", "-duration", "150ms"}, []int{4}, 150 * time.Millisecond},
		{[]string{"-serve-backends", "SQLite, postgresql,mariadb,redis"}, []int{16}, 3 * time.Second},
	} {
		o, err := parseOptions(c.args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if !slices.Equal(o.ServeConcurrency, c.conc) || o.ServeDuration != c.slice {
			t.Errorf("%v: serve concurrency %v, slice %v; want %v, %v", c.args, o.ServeConcurrency, o.ServeDuration, c.conc, c.slice)
		}
	}
	for _, bad := range [][]string{{"-serve-concurrency", "0"}, {"-serve-concurrency", "x"}, {"-serve-duration", "0s"}, {"-serve-backends", "postgres"}, {"-serve-backends", "sqlite,"}} {
		if _, err := parseOptions(bad, io.Discard); err == nil {
			t.Errorf("%v: accepted", bad)
		}
	}
}

// TestProcessCPU checks the /proc reading behind the serve scenario's CPU
// per request: this process's CPU time grows by at least the time it spins
// (less one clock tick), and an unknown process has no reading.
func TestProcessCPU(t *testing.T) {
	before := processCPU(os.Getpid())
	if before < 0 {
		t.Skip("no /proc/PID/stat here")
	}
	// Spin until the kernel's own account of this process (getrusage)
	// shows 200 ms more CPU, however long that takes on a busy machine,
	// and compare /proc's reading with it: both count the same clock, and
	// /proc's ticks are 10 ms apart.
	rusage := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	spin, r0 := 200*time.Millisecond, rusage()
	deadline := time.Now().Add(time.Minute)
	for rusage()-r0 < spin {
		if time.Now().After(deadline) {
			t.Fatal("the process got less than 200 ms of CPU in a minute")
		}
	}
	grew, want := processCPU(os.Getpid())-before, rusage()-r0
	if d := grew - want; d < -30*time.Millisecond || d > 30*time.Millisecond {
		t.Errorf("/proc says the CPU time grew by %v, getrusage by %v", grew, want)
	}
	if got := cpuPerRequest(before, before+time.Millisecond, 10); got != 100 {
		t.Errorf("1 ms over 10 requests = %v µs, want 100", got)
	}
	if got := processCPU(-1); got != -1 {
		t.Errorf("processCPU(-1) = %v, want -1", got)
	}
	if got := cpuPerRequest(-1, time.Second, 10); got != 0 {
		t.Errorf("cpuPerRequest without a reading = %v, want 0", got)
	}
}
