package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem/sqlitestore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// idemBinary builds cmd/idem once per run and returns its path.
func (e *env) idemBinary(ctx context.Context) (string, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	bin := filepath.Join(e.tmp, "idem")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/idem")
	cmd.Dir = e.o.Repo
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build ./cmd/idem in %s: %w: %s", e.o.Repo, err, strings.TrimSpace(string(out)))
	}
	return bin, nil
}

// startIdem runs `idem serve` or `idem proxy` (sub) as a process and reads
// its address from its JSON log line "idem <sub> listening".
func (e *env) startIdem(ctx context.Context, bin, sub string, args ...string) (*child, error) {
	cmd := exec.CommandContext(ctx, bin, append([]string{sub, "--addr", "127.0.0.1:0", "--log-format", "json", "--access-log=false"}, args...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	c := &child{name: "idem " + sub, cmd: cmd, stdin: stdin, done: make(chan struct{}), stderr: &tailBuffer{max: 4096}}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		_ = cmd.Wait()
		close(c.done)
	}()
	addr := make(chan string, 1)
	go func() {
		// Read everything the server logs, so that it never blocks on a
		// full pipe, keeping only the tail.
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		found := false
		for sc.Scan() {
			line := sc.Bytes()
			if !found {
				var l struct {
					Msg  string `json:"msg"`
					Addr string `json:"addr"`
				}
				if json.Unmarshal(line, &l) == nil && l.Msg == "idem "+sub+" listening" {
					found = true
					addr <- l.Addr
				}
				_, _ = c.stderr.Write(append(line, '\n'))
				continue
			}
			// Errors only, not every access line.
			if !strings.Contains(string(line), `"level":"INFO"`) {
				_, _ = c.stderr.Write(append(line, '\n'))
			}
		}
	}()
	t := time.NewTimer(time.Minute)
	defer t.Stop()
	select {
	case a := <-addr:
		c.addr = a
	case <-c.done:
		return nil, fmt.Errorf("idem %s exited: %s", sub, c.stderr.String())
	case <-t.C:
		c.stop()
		return nil, fmt.Errorf("idem %s did not log its address: %s", sub, c.stderr.String())
	}
	e.mu.Lock()
	e.children = append(e.children, c)
	e.mu.Unlock()
	return c, nil
}

// serveBackend is one database setup of the serve scenario: where idem
// serve keeps payments (--db) and records (--store, empty: the same
// database), and the targets of its two ratios (0: reported only).
type serveBackend struct {
	name                string
	records             string // "" or "redis"
	pg, mysql           bool
	firstMin, replayMin float64
}

// serveBackends are the serve scenario's setups, in the order of its
// table: the targets for records in the payments' database, the
// Redis setups reported without one.
var serveBackends = []serveBackend{
	{name: "SQLite", firstMin: 0.5, replayMin: 0.9},
	{name: "PostgreSQL", pg: true, firstMin: 0.5, replayMin: 0.9},
	{name: "MariaDB", mysql: true, firstMin: 0.5, replayMin: 0.9},
	{name: "Redis records, SQLite payments", records: "redis"},
	{name: "Redis records, PostgreSQL payments", records: "redis", pg: true},
}

// runServe measures `idem serve` (the payments demo) against the plain
// handler (plain-payments: the same endpoint without idempotency, see
// runPlainPayments) on the same database, both as processes, in
// alternating slices.
func (e *env) runServe(ctx context.Context, r *report) error {
	bin, err := e.idemBinary(ctx)
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "`idem serve --access-log=false --log-format json` (the payments demo, built from cmd/idem, otherwise its defaults) against **the plain handler** (`bench plain-payments`, a process of its own on the same database): `POST /api/payments` decodes and validates the same JSON, inserts one row into a table whose only index is its primary key and answers 201; `GET /api/payments/{id}` reads one row by primary key. Its pools are sized like idem's: for SQLite `sqlitestore.Open`'s (one writer connection, %d read-only connections, idle = open), for PostgreSQL a `pgxpool` with the same defaults as `idem serve`'s and every connection opened at start (MinConns = MaxConns). First execution: `idem serve` with a new key per request vs the plain insert; replay: the same POST with a completed key (one per client) vs the plain primary-key read. keep-alive clients: %s, closed loop; %d round(s), each one %v slice of each process, alternating which goes first; ratio = median of the per-round ratios.\n\n",
		4*runtime.NumCPU(), joinInts(e.o.ServeConcurrency), e.o.Rounds, e.o.ServeDuration)
	b.WriteString("| database | path | clients | idem serve req/s | plain req/s | ratio | target | CPU µs/req idem serve / plain | idem serve p50 / p99 ms | plain p50 / p99 ms |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	body := []byte(`{"amountCents":2599,"currency":"USD","reference":"order-1001"}`)
	var met, total [2]int
	var vals [2][]string
	maxConc := 0
	for _, c := range e.o.ServeConcurrency {
		maxConc = max(maxConc, c)
	}
	for bi, bd := range serveBackends {
		if (bd.pg && !e.pgOK) || (bd.mysql && !e.myOK) || (bd.records == "redis" && !e.redOK) || !e.o.serveBackend(bd.name) {
			continue
		}
		var db string
		switch {
		case bd.mysql:
			var drop func()
			if db, drop, err = e.myDatabase(ctx, fmt.Sprintf("serve%d", bi)); err != nil {
				return err
			}
			defer drop()
		case bd.pg:
			if db, err = e.database(ctx, fmt.Sprintf("serve%d", bi)); err != nil {
				return err
			}
		default:
			db = filepath.Join(e.tmp, fmt.Sprintf("serve%d.db", bi))
		}
		args := []string{"--db", db}
		if bd.records == "redis" {
			u, err := url.Parse(e.o.RedisURL)
			if err != nil {
				return err
			}
			q := u.Query()
			q.Set("prefix", e.prefix(fmt.Sprintf("serve%d", bi)))
			u.RawQuery = q.Encode()
			args = append(args, "--store", u.String())
		}
		srv, err := e.startIdem(ctx, bin, "serve", args...)
		if err != nil {
			return err
		}
		plain, err := startChild(ctx, "plain-payments", e.o.Exe, "plain-payments", "-db", db)
		if err != nil {
			return err
		}
		e.mu.Lock()
		e.children = append(e.children, plain)
		e.mu.Unlock()
		sc, pc := newClient(maxConc), newClient(maxConc)
		// Rows for the plain reads: one per client.
		ids := make([]string, maxConc)
		for i := range ids {
			if ids[i], err = createPlainPayment(ctx, pc, plain.url(pathPayments), body); err != nil {
				return err
			}
		}
		for pi, path := range []string{scFirst, scReplay} {
			target := []float64{bd.firstMin, bd.replayMin}[pi]
			for _, conc := range e.o.ServeConcurrency {
				// One completed key per client, for the replays.
				keys := make([]string, conc)
				for i := range keys {
					keys[i] = e.newKey()
				}
				var ss, ps []sample
				var ratios []float64
				// CPU time of each server process per request (µs), by
				// round: unlike req/s, it hardly depends on what else the
				// machine runs.
				var sCPU, pCPU []float64
				for round := range e.o.Rounds {
					var sSm, pSm sample
					for k := range 2 {
						if (k+round)%2 == 0 {
							u := srv.url(pathPayments)
							spec := loadSpec{Workers: conc, Duration: e.o.ServeDuration, Warmup: 2, Status: http.StatusCreated}
							spec.Req = func(w, i int) request {
								if path == scFirst {
									return request{method: "POST", url: u, body: body, key: e.newKey()}
								}
								return request{method: "POST", url: u, body: body, key: keys[w]}
							}
							t0 := processCPU(srv.pid())
							if sSm, err = e.loadOn(ctx, srv, sc, spec, fmt.Sprintf("serve%d-idem-%s-c%d-r%d", bi, path, conc, round)); err != nil {
								return err
							}
							sCPU = append(sCPU, cpuPerRequest(t0, processCPU(srv.pid()), sSm.Requests+int64(conc*spec.Warmup)))
						} else {
							u := plain.url(pathPayments)
							spec := loadSpec{Workers: conc, Duration: e.o.ServeDuration, Warmup: 2, Status: http.StatusCreated}
							if path == scReplay {
								spec.Status = http.StatusOK
								spec.Req = func(w, i int) request { return request{method: "GET", url: u + "/" + ids[w]} }
							} else {
								spec.Req = func(w, i int) request { return request{method: "POST", url: u, body: body} }
							}
							t0 := processCPU(plain.pid())
							if pSm, err = e.loadOn(ctx, plain, pc, spec, fmt.Sprintf("serve%d-plain-%s-c%d-r%d", bi, path, conc, round)); err != nil {
								return err
							}
							pCPU = append(pCPU, cpuPerRequest(t0, processCPU(plain.pid()), pSm.Requests+int64(conc*spec.Warmup)))
						}
					}
					e.o.logf("serve %s %s c=%d r=%d: idem serve %.0f req/s %.1f µs CPU/req, plain %.0f req/s %.1f µs CPU/req (load %s)", bd.name, path, conc, round,
						sSm.Throughput, sCPU[len(sCPU)-1], pSm.Throughput, pCPU[len(pCPU)-1], loadAverage())
					ss, ps = append(ss, sSm), append(ps, pSm)
					ratios = append(ratios, sSm.Throughput/pSm.Throughput)
				}
				as, ap := aggregate(ss), aggregate(ps)
				q := median(ratios)
				tgt := "—"
				if target > 0 {
					tgt = fmt.Sprintf("≥ %.1f", target)
					total[pi]++
					if q >= target {
						met[pi]++
					}
					vals[pi] = append(vals[pi], fmt.Sprintf("%s %.2f @%d", bd.name, q, conc))
				}
				fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | **%.2f** | %s | %.1f / %.1f | %s / %s | %s / %s |\n", bd.name, path, conc,
					fmtInt(as.thr), fmtInt(ap.thr), q, tgt, median(sCPU), median(pCPU), fmtDur(as.p50), fmtDur(as.p99), fmtDur(ap.p50), fmtDur(ap.p99))
			}
		}
		srv.stop()
		plain.stop()
	}
	if total[0]+total[1] == 0 {
		return nil
	}
	r.add("`idem serve` vs the plain handler on the same database", b.String())
	r.addTarget("`idem serve` first execution ≥ 0.5 (SQLite, PostgreSQL, MariaDB) of the plain insert", strings.Join(vals[0], ", "), verdict(met[0], total[0]))
	r.addTarget("`idem serve` replay ≥ 0.9 of the plain primary-key read", strings.Join(vals[1], ", "), verdict(met[1], total[1]))
	return nil
}

// createPlainPayment creates a payment through the plain handler and
// returns its id.
func createPlainPayment(ctx context.Context, c *http.Client, url string, body []byte) (string, error) {
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(string(body)))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var p plainPayment
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || resp.StatusCode != http.StatusCreated || p.ID == "" {
		return "", fmt.Errorf("plain payment: status %d, %v", resp.StatusCode, err)
	}
	return p.ID, nil
}

// plainPayment is a payment as the plain handler stores and answers it,
// with the fields of the payments demo.
type plainPayment struct {
	ID          string    `json:"id"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
	Reference   string    `json:"reference"`
	CreatedAt   time.Time `json:"createdAt"`
}

// The plain handler's table: the payments demo's columns without the
// idempotency key, and no index but the primary key (a UNIQUE index on
// the key would already be a form of idempotency, and cost an index
// write per insert).
const (
	plainTableSQLite = `CREATE TABLE IF NOT EXISTS plain_payments (
	id           TEXT    PRIMARY KEY,
	tenant       TEXT    NOT NULL,
	amount_cents INTEGER NOT NULL,
	currency     TEXT    NOT NULL,
	reference    TEXT    NOT NULL,
	created_at   TEXT    NOT NULL
)`
	plainTablePG = `CREATE TABLE IF NOT EXISTS plain_payments (
	id           TEXT        PRIMARY KEY,
	tenant       TEXT        NOT NULL,
	amount_cents BIGINT      NOT NULL,
	currency     TEXT        NOT NULL,
	reference    TEXT        NOT NULL,
	created_at   TIMESTAMPTZ NOT NULL
)`
)

// runPlainPayments is the hidden plain-payments subcommand, THE plain
// handler the serve scenario compares idem serve with: POST /api/payments
// decodes and validates the JSON, inserts one row into a table whose only
// index is the primary key and answers 201; GET /api/payments/{id} reads
// one row by primary key. No idempotency. Its pools are sized like idem
// serve's. It serves until its standard input closes.
func runPlainPayments(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("plain-payments", flag.ContinueOnError)
	db := fs.String("db", "", "SQLite file, postgres:// or mysql:// URL")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	var (
		insert func(ctx context.Context, p plainPayment) error
		get    func(ctx context.Context, id string) (plainPayment, error)
	)
	if strings.HasPrefix(*db, "mysql://") {
		mdb, err := openPlainMySQL(ctx, *db)
		if err != nil {
			return err
		}
		defer mdb.Close()
		insert, get = plainMySQL(mdb)
	} else if strings.HasPrefix(*db, "postgres://") || strings.HasPrefix(*db, "postgresql://") {
		// idem serve's pool: pgxpool's defaults (MaxConns = max(4,
		// NumCPU)); every connection opened at start and kept.
		cfg, err := pgxpool.ParseConfig(*db)
		if err != nil {
			return err
		}
		cfg.MinConns = cfg.MaxConns
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return err
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, plainTablePG); err != nil {
			return err
		}
		insert = func(ctx context.Context, p plainPayment) error {
			_, err := pool.Exec(ctx, `INSERT INTO plain_payments (id, tenant, amount_cents, currency, reference, created_at)
				VALUES ($1, $2, $3, $4, $5, $6)`, p.ID, "anonymous", p.AmountCents, p.Currency, p.Reference, p.CreatedAt)
			return err
		}
		get = func(ctx context.Context, id string) (plainPayment, error) {
			var p plainPayment
			err := pool.QueryRow(ctx, `SELECT id, amount_cents, currency, reference, created_at FROM plain_payments WHERE id = $1`, id).
				Scan(&p.ID, &p.AmountCents, &p.Currency, &p.Reference, &p.CreatedAt)
			if errors.Is(err, pgx.ErrNoRows) {
				return p, errNotFound
			}
			return p, err
		}
	} else {
		// idem serve's pools: sqlitestore.Open's writer (one connection)
		// and reader (4 × NumCPU, idle = open), same pragmas; the store's
		// own table is created and never used.
		s, err := sqlitestore.Open(ctx, *db, nil)
		if err != nil {
			return err
		}
		defer s.Close()
		if _, err := s.DB().ExecContext(ctx, plainTableSQLite); err != nil {
			return err
		}
		ins, err := s.DB().PrepareContext(ctx, `INSERT INTO plain_payments (id, tenant, amount_cents, currency, reference, created_at) VALUES (?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return err
		}
		defer ins.Close()
		sel, err := s.ReadDB().PrepareContext(ctx, `SELECT id, amount_cents, currency, reference, created_at FROM plain_payments WHERE id = ?`)
		if err != nil {
			return err
		}
		defer sel.Close()
		insert = func(ctx context.Context, p plainPayment) error {
			_, err := ins.ExecContext(ctx, p.ID, "anonymous", p.AmountCents, p.Currency, p.Reference, p.CreatedAt.Format(time.RFC3339Nano))
			return err
		}
		get = func(ctx context.Context, id string) (plainPayment, error) {
			var p plainPayment
			var created string
			err := sel.QueryRowContext(ctx, id).Scan(&p.ID, &p.AmountCents, &p.Currency, &p.Reference, &created)
			if errors.Is(err, sql.ErrNoRows) {
				return p, errNotFound
			}
			if err == nil {
				p.CreatedAt, err = time.Parse(time.RFC3339Nano, created)
			}
			return p, err
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/payments", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			AmountCents int64  `json:"amountCents"`
			Currency    string `json:"currency"`
			Reference   string `json:"reference"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 16<<10)).Decode(&in); err != nil || in.AmountCents <= 0 || len(in.Currency) != 3 || strings.TrimSpace(in.Reference) == "" {
			http.Error(w, "invalid payment", http.StatusBadRequest)
			return
		}
		p := plainPayment{ID: "pay_" + strings.ToLower(rand.Text()), AmountCents: in.AmountCents, Currency: strings.ToUpper(in.Currency),
			Reference: strings.TrimSpace(in.Reference), CreatedAt: time.Now().UTC().Truncate(time.Microsecond)}
		if err := insert(r.Context(), p); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/api/payments/"+p.ID)
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(p)
	})
	mux.HandleFunc("GET /api/payments/{id}", func(w http.ResponseWriter, r *http.Request) {
		p, err := get(r.Context(), r.PathValue("id"))
		switch {
		case errors.Is(err, errNotFound):
			http.Error(w, "not found", http.StatusNotFound)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(p)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := json.NewEncoder(os.Stdout).Encode(ready{Addr: ln.Addr().String()}); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return srv.Close()
	}
}

var errNotFound = errors.New("not found")

// runCheck grades Fiber's idempotency middleware (and, for contrast,
// idem's) with `idem check`, and records the reports.
func (e *env) runCheck(ctx context.Context, r *report) error {
	bin, err := e.idemBinary(ctx)
	if err != nil {
		return err
	}
	var b strings.Builder
	body := `{"amountCents":100,"currency":"USD","reference":"t"}`
	b.WriteString("`idem check` (built from cmd/idem) run against each system's `POST /api/payments`, served by a process of this harness. Fiber's middleware is configured with the standard header name `Idempotency-Key` and a validator accepting any key up to 255 bytes (its default wants exactly 36 characters), memory storage and lock (its defaults); idem runs with its defaults (a key is required on POST). In both, the handler's answer carries an execution counter, so that the checks can tell a replay from a second execution.\n\n")
	for _, sys := range []string{sysFiberIdem, sysMem} {
		c, err := e.start(ctx, sys, append(e.systemArgs(sys, "check"), "-check")...)
		if err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, bin, "check", "--body", body, c.url(pathPayments))
		out, err := cmd.CombinedOutput()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			c.stop()
			return err
		}
		c.stop()
		fmt.Fprintf(&b, "**`%s`** (%s) — `idem check --body '%s' http://127.0.0.1:PORT/api/payments`, exit status %d:\n\n```\n%s\n```\n\n",
			sys, systemNotes[sys], body, code, strings.TrimSpace(string(out)))
		e.o.logf("check %s: exit %d", sys, code)
	}
	r.add("`idem check` against Fiber v3's idempotency middleware", b.String())
	return nil
}

// joinInts formats counts as "1, 8, 32".
func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

// processCPU returns the CPU time (user and system) the process pid has
// used so far, from /proc/PID/stat; -1 where /proc cannot tell.
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	// The command name (field 2) may hold spaces: count from its ")".
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return -1
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	// Linux reports both in clock ticks of 1/100 s (USER_HZ) on every
	// architecture Go supports.
	return time.Duration(ut+st) * (time.Second / 100)
}

// cpuPerRequest is the CPU time between two processCPU readings per
// request, in µs; 0 without a reading.
func cpuPerRequest(before, after time.Duration, requests int64) float64 {
	if before < 0 || after < 0 || requests == 0 {
		return 0
	}
	return float64(after-before) / float64(time.Microsecond) / float64(requests)
}

// loadAverage is the machine's one-minute load average, as /proc/loadavg
// says it ("?" where it cannot).
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}
