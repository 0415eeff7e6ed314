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
	"os"
	"os/exec"
	"path/filepath"
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

// runServe measures `idem serve` (the payments demo) next to bare Go
// handlers on the same database without idempotency, both as processes.
func (e *env) runServe(ctx context.Context, r *report) error {
	bin, err := e.idemBinary(ctx)
	if err != nil {
		return err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "`idem serve` (the payments demo, built from cmd/idem and run as a process with its defaults, `--log-format json` and `--access-log=false`, as the bare handlers log nothing per request either) next to `bench bare-payments`, bare Go handlers in a process of their own on the same database without idempotency (same connection setup: `sqlitestore.Open`'s pools for SQLite, a default `pgxpool` for PostgreSQL). First execution: `POST /api/payments` with a new key and `{\"amountCents\":2599,\"currency\":\"USD\",\"reference\":\"order-1001\"}` vs a bare handler that validates the same body and inserts the payment row. Replay: the same POST with a completed key vs a bare handler reading one payment by primary key (`GET /api/payments/{id}`). %v per measurement, %d round(s) alternating the two processes; ratio = median of per-round ratios.\n\n",
		e.o.Duration, e.o.Rounds)
	b.WriteString("| database | path | workers | idem serve req/s | bare req/s | ratio | target | idem serve p50 / p99 ms | bare p50 / p99 ms |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	type backendDef struct {
		name string
		spec func() (string, error)
		ok   bool
	}
	backends := []backendDef{
		{"SQLite", func() (string, error) { return filepath.Join(e.tmp, "serve.db"), nil }, true},
		{"PostgreSQL", func() (string, error) { return e.database(ctx, "serve") }, e.pgOK},
	}
	body := []byte(`{"amountCents":2599,"currency":"USD","reference":"order-1001"}`)
	var met, total [2]int
	var vals [2][]string
	for _, bd := range backends {
		if !bd.ok {
			continue
		}
		db, err := bd.spec()
		if err != nil {
			return err
		}
		srv, err := e.startIdem(ctx, bin, "serve", "--db", db)
		if err != nil {
			return err
		}
		bare, err := startChild(ctx, "bare-payments", e.o.Exe, "bare-payments", "-db", db)
		if err != nil {
			return err
		}
		e.mu.Lock()
		e.children = append(e.children, bare)
		e.mu.Unlock()
		maxConc := 0
		for _, c := range e.o.Concurrency {
			maxConc = max(maxConc, c)
		}
		sc, bc := newClient(maxConc), newClient(maxConc)
		// Payments for the bare reads: one per worker.
		ids := make([]string, maxConc)
		for i := range ids {
			if ids[i], err = createBarePayment(ctx, bc, bare.url(pathPayments), body); err != nil {
				return err
			}
		}
		for pi, path := range []string{scFirst, scReplay} {
			target := []float64{0.5, 0.9}[pi]
			for _, conc := range e.o.Concurrency {
				var ss, bs []sample
				var ratios []float64
				for round := range e.o.Rounds {
					var sSm, bSm sample
					for k := range 2 {
						if (k+round)%2 == 0 {
							keys := make([]string, conc)
							for i := range keys {
								keys[i] = e.newKey()
							}
							url := srv.url(pathPayments)
							spec := loadSpec{Workers: conc, Duration: e.o.Duration, Warmup: 2, Status: http.StatusCreated}
							spec.Req = func(w, i int) request {
								if path == scFirst {
									return request{method: "POST", url: url, body: body, key: e.newKey()}
								}
								return request{method: "POST", url: url, body: body, key: keys[w]}
							}
							if sSm, err = e.loadOn(ctx, srv, sc, spec, fmt.Sprintf("serve-%s-%s-c%d-r%d", bd.name, path, conc, round)); err != nil {
								return err
							}
						} else {
							spec := loadSpec{Workers: conc, Duration: e.o.Duration, Warmup: 2, Status: http.StatusCreated}
							url := bare.url(pathPayments)
							if path == scReplay {
								spec.Status = http.StatusOK
								spec.Req = func(w, i int) request { return request{method: "GET", url: url + "/" + ids[w]} }
							} else {
								spec.Req = func(w, i int) request { return request{method: "POST", url: url, body: body} }
							}
							if bSm, err = e.loadOn(ctx, bare, bc, spec, fmt.Sprintf("bare-%s-%s-c%d-r%d", bd.name, path, conc, round)); err != nil {
								return err
							}
						}
					}
					e.o.logf("serve %s %s c=%d r=%d: idem serve %.0f req/s, bare %.0f req/s", bd.name, path, conc, round, sSm.Throughput, bSm.Throughput)
					ss, bs = append(ss, sSm), append(bs, bSm)
					ratios = append(ratios, sSm.Throughput/bSm.Throughput)
				}
				as, ab := aggregate(ss), aggregate(bs)
				q := median(ratios)
				total[pi]++
				if q >= target {
					met[pi]++
				}
				vals[pi] = append(vals[pi], fmt.Sprintf("%s %.2f @%d", bd.name, q, conc))
				fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | **%.2f** | ≥ %.1f | %s / %s | %s / %s |\n", bd.name, path, conc,
					fmtInt(as.thr), fmtInt(ab.thr), q, target, fmtDur(as.p50), fmtDur(as.p99), fmtDur(ab.p50), fmtDur(ab.p99))
			}
		}
		srv.stop()
		bare.stop()
	}
	if total[0]+total[1] == 0 {
		return nil
	}
	r.add("`idem serve` vs bare handlers on the same database", b.String())
	r.addTarget("`idem serve` first execution ≥ 0.5 of a bare insert handler", strings.Join(vals[0], ", "), verdict(met[0], total[0]))
	r.addTarget("`idem serve` replay ≥ 0.9 of a bare primary-key read handler", strings.Join(vals[1], ", "), verdict(met[1], total[1]))
	return nil
}

// createBarePayment creates a payment through the bare handlers and
// returns its id.
func createBarePayment(ctx context.Context, c *http.Client, url string, body []byte) (string, error) {
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
	var p barePayment
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || resp.StatusCode != http.StatusCreated || p.ID == "" {
		return "", fmt.Errorf("bare payment: status %d, %v", resp.StatusCode, err)
	}
	return p.ID, nil
}

// barePayment is a payment as the bare handlers store and answer it, with
// the fields of the payments demo.
type barePayment struct {
	ID          string    `json:"id"`
	AmountCents int64     `json:"amountCents"`
	Currency    string    `json:"currency"`
	Reference   string    `json:"reference"`
	CreatedAt   time.Time `json:"createdAt"`
}

// paymentsTable is the payments demo's table (cmd/idem/internal/payments),
// created if absent; the bare handlers write the same rows.
const paymentsTableSQLite = `CREATE TABLE IF NOT EXISTS payments (
	id              TEXT    PRIMARY KEY,
	tenant          TEXT    NOT NULL,
	idempotency_key TEXT    NOT NULL,
	amount_cents    INTEGER NOT NULL,
	currency        TEXT    NOT NULL,
	reference       TEXT    NOT NULL,
	created_at      TEXT    NOT NULL,
	UNIQUE (tenant, idempotency_key)
)`

const paymentsTablePG = `CREATE TABLE IF NOT EXISTS payments (
	id              TEXT        PRIMARY KEY,
	tenant          TEXT        NOT NULL,
	idempotency_key TEXT        NOT NULL,
	amount_cents    BIGINT      NOT NULL,
	currency        TEXT        NOT NULL,
	reference       TEXT        NOT NULL,
	created_at      TIMESTAMPTZ NOT NULL,
	UNIQUE (tenant, idempotency_key)
)`

// runBarePayments is the hidden bare-payments subcommand: POST
// /api/payments validates and inserts a payment, GET /api/payments/{id}
// reads one by primary key; no idempotency. It serves until its standard
// input closes.
func runBarePayments(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bare-payments", flag.ContinueOnError)
	db := fs.String("db", "", "SQLite file or postgres:// URL")
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
		insert func(ctx context.Context, p barePayment) error
		get    func(ctx context.Context, id string) (barePayment, error)
	)
	if strings.HasPrefix(*db, "postgres://") || strings.HasPrefix(*db, "postgresql://") {
		pool, err := pgxpool.New(ctx, *db)
		if err != nil {
			return err
		}
		defer pool.Close()
		if _, err := pool.Exec(ctx, paymentsTablePG); err != nil {
			return err
		}
		insert = func(ctx context.Context, p barePayment) error {
			_, err := pool.Exec(ctx, `INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7)`, p.ID, "anonymous", p.ID, p.AmountCents, p.Currency, p.Reference, p.CreatedAt)
			return err
		}
		get = func(ctx context.Context, id string) (barePayment, error) {
			var p barePayment
			err := pool.QueryRow(ctx, `SELECT id, amount_cents, currency, reference, created_at FROM payments WHERE id = $1 AND tenant = $2`, id, "anonymous").
				Scan(&p.ID, &p.AmountCents, &p.Currency, &p.Reference, &p.CreatedAt)
			if errors.Is(err, pgx.ErrNoRows) {
				return p, errNotFound
			}
			return p, err
		}
	} else {
		s, err := sqlitestore.Open(ctx, *db, nil)
		if err != nil {
			return err
		}
		defer s.Close()
		if _, err := s.DB().ExecContext(ctx, paymentsTableSQLite); err != nil {
			return err
		}
		insert = func(ctx context.Context, p barePayment) error {
			_, err := s.DB().ExecContext(ctx, `INSERT INTO payments (id, tenant, idempotency_key, amount_cents, currency, reference, created_at)
				VALUES (?, ?, ?, ?, ?, ?, ?)`, p.ID, "anonymous", p.ID, p.AmountCents, p.Currency, p.Reference, p.CreatedAt.Format(time.RFC3339Nano))
			return err
		}
		get = func(ctx context.Context, id string) (barePayment, error) {
			var p barePayment
			var created string
			err := s.ReadDB().QueryRowContext(ctx, `SELECT id, amount_cents, currency, reference, created_at FROM payments WHERE id = ? AND tenant = ?`, id, "anonymous").
				Scan(&p.ID, &p.AmountCents, &p.Currency, &p.Reference, &created)
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
		body, err := io.ReadAll(io.LimitReader(r.Body, 16<<10))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var in struct {
			AmountCents int64  `json:"amountCents"`
			Currency    string `json:"currency"`
			Reference   string `json:"reference"`
		}
		if err := json.Unmarshal(body, &in); err != nil || in.AmountCents <= 0 || len(in.Currency) != 3 || strings.TrimSpace(in.Reference) == "" {
			http.Error(w, "invalid payment", http.StatusBadRequest)
			return
		}
		p := barePayment{ID: "pay_" + strings.ToLower(rand.Text()), AmountCents: in.AmountCents, Currency: strings.ToUpper(in.Currency),
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
