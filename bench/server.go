package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v3"
	fiberidem "github.com/gofiber/fiber/v3/middleware/idempotency"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/memstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/idemhq/idem/sqlitestore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// The systems the harness measures. Each runs in a process of its own (a
// child of the harness started with the hidden serve-system subcommand),
// so that its allocations and memory are its own and not the load
// generator's.
const (
	sysBare       = "bare"        // net/http handler, no idempotency
	sysMem        = "idem-mem"    // idem middleware on memstore
	sysSQLite     = "idem-sqlite" // idem middleware on sqlitestore
	sysPG         = "idem-pg"     // idem middleware on pgstore
	sysRedis      = "idem-redis"  // idem middleware on redisstore
	sysFiberBare  = "fiber-bare"  // Fiber v3 handler, no idempotency
	sysFiberIdem  = "fiber-idem"  // Fiber v3 idempotency middleware (memory storage)
	pathPayments  = "/api/payments"
	pathSlow      = "/api/slow"
	patternCreate = "POST " + pathPayments
)

// appResponsePrefix starts what the application handler answers: a small
// JSON body, as a payment API would.
var appResponsePrefix = []byte(`{"id":"pay_123","status":"succeeded","amountCents":2599,"currency":"USD","bytes":`)

// appHandler is the application: it reads the body and answers 201 with a
// small JSON document. It is the same for every net/http system.
func appHandler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(appBody(len(body)))
}

// numbered makes every answer carry an execution counter (for idem check,
// which compares bodies to tell replays from executions).
var (
	numbered   bool
	executions atomic.Int64
)

func appBody(n int) []byte {
	b := make([]byte, 0, 160)
	b = append(b, appResponsePrefix...)
	b = strconv.AppendInt(b, int64(n), 10)
	if numbered {
		b = append(b, `,"execution":`...)
		b = strconv.AppendInt(b, executions.Add(1), 10)
	}
	return append(b, '}')
}

// gate holds slow requests (the 409 path's first attempt) until the
// harness releases them.
type gate struct {
	mu sync.Mutex
	ch chan struct{}
	// entered receives a value when a slow request starts waiting.
	entered chan struct{}
}

func newGate() *gate { return &gate{ch: make(chan struct{}), entered: make(chan struct{}, 1)} }

// enter records that a slow request is being held.
func (g *gate) enter() {
	select {
	case g.entered <- struct{}{}:
	default:
	}
}

func (g *gate) wait() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ch
}

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.ch)
	g.ch = make(chan struct{})
}

// slowHandler is the application's slow operation: it holds the request
// until the harness releases it (at most maxSlow), then answers as
// appHandler does.
func (g *gate) slowHandler(w http.ResponseWriter, r *http.Request) {
	t := time.NewTimer(maxSlow)
	defer t.Stop()
	release := g.wait()
	g.enter()
	select {
	case <-release:
	case <-t.C:
	case <-r.Context().Done():
		return
	}
	appHandler(w, r)
}

// maxSlow bounds how long a slow request is held if the harness never
// releases it.
const maxSlow = 5 * time.Minute

// serverOpts configure a serve-system process.
type serverOpts struct {
	system      string
	sqlitePath  string
	pgURL       string
	pgSchema    string
	pgConns     int
	redisURL    string
	redisPrefix string
	// check serves idem with its default key requirement and an
	// application whose answers differ per execution, for idem check.
	check bool
}

// ready is the line a serve-system process prints on stdout once it
// listens.
type ready struct {
	Addr string `json:"addr"`
	Ctl  string `json:"ctl"`
}

// stats is what a serve-system process reports on its control address.
type stats struct {
	Mallocs    uint64 `json:"mallocs"`
	TotalAlloc uint64 `json:"totalAlloc"`
	HeapInuse  uint64 `json:"heapInuse"`
	NumGC      uint32 `json:"numGC"`
}

// runServeSystem is the hidden serve-system subcommand: it serves one
// system until its standard input closes (the harness exited or stopped
// it) or it receives a signal.
func runServeSystem(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve-system", flag.ContinueOnError)
	var o serverOpts
	fs.StringVar(&o.system, "system", "", "system to serve")
	fs.StringVar(&o.sqlitePath, "sqlite", "", "SQLite file")
	fs.StringVar(&o.pgURL, "pg", "", "PostgreSQL URL")
	fs.StringVar(&o.pgSchema, "pg-schema", "", "PostgreSQL schema for the records")
	fs.IntVar(&o.pgConns, "pg-conns", 32, "PostgreSQL pool size")
	fs.StringVar(&o.redisURL, "redis", "", "Redis URL")
	fs.StringVar(&o.redisPrefix, "redis-prefix", "", "Redis key prefix")
	fs.BoolVar(&o.check, "check", false, "serve for idem check: key required, answers numbered per execution")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// The harness holds our standard input open while it needs us.
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()

	numbered = o.check
	g := newGate()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ctlLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ctl := http.NewServeMux()
	ctl.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		_ = json.NewEncoder(w).Encode(stats{Mallocs: ms.Mallocs, TotalAlloc: ms.TotalAlloc, HeapInuse: ms.HeapInuse, NumGC: ms.NumGC})
	})
	ctl.HandleFunc("POST /release", func(w http.ResponseWriter, r *http.Request) { g.release() })
	// await-slow answers once a slow request is held (or 503 after 30 s).
	ctl.HandleFunc("POST /await-slow", func(w http.ResponseWriter, r *http.Request) {
		t := time.NewTimer(30 * time.Second)
		defer t.Stop()
		select {
		case <-g.entered:
		case <-t.C:
			w.WriteHeader(http.StatusServiceUnavailable)
		case <-r.Context().Done():
		}
	})
	ctlSrv := &http.Server{Handler: ctl}
	go func() { _ = ctlSrv.Serve(ctlLn) }()
	defer ctlSrv.Close()

	serve, store, closeFn, err := buildSystem(ctx, o, g)
	if err != nil {
		return err
	}
	defer closeFn()
	// delete-expired runs DeleteExpired in batches until none is left,
	// inside this process, as a service's own cleanup loop does (`idem
	// serve` runs one), and reports what it did.
	ctl.HandleFunc("POST /delete-expired", func(w http.ResponseWriter, r *http.Request) {
		if store == nil {
			http.Error(w, "no store", http.StatusNotFound)
			return
		}
		batch, err := strconv.Atoi(r.URL.Query().Get("batch"))
		if err != nil || batch < 1 {
			http.Error(w, "batch must be a positive number", http.StatusBadRequest)
			return
		}
		var res deletion
		start := time.Now()
		for {
			n, err := store.DeleteExpired(r.Context(), idemstore.DeleteExpiredParams{Limit: batch, Now: time.Now()})
			res.Calls++
			res.Deleted += n
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			if n < batch {
				break
			}
		}
		res.Took = time.Since(start)
		_ = json.NewEncoder(w).Encode(res)
	})
	if err := json.NewEncoder(os.Stdout).Encode(ready{Addr: ln.Addr().String(), Ctl: ctlLn.Addr().String()}); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return nil
	}
}

// deletion is what a delete-expired control call did.
type deletion struct {
	Deleted, Calls int
	Took           time.Duration
}

// buildSystem returns a function serving the system on a listener, its
// idem store (nil for systems without one), and a function releasing its
// resources.
func buildSystem(ctx context.Context, o serverOpts, g *gate) (func(net.Listener) error, idemstore.Store, func(), error) {
	switch o.system {
	case sysFiberBare, sysFiberIdem:
		app := fiberApp(o.system == sysFiberIdem, g)
		return func(ln net.Listener) error {
			return app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true})
		}, nil, func() { _ = app.Shutdown() }, nil
	}
	h, store, closeFn, err := buildHandler(ctx, o, g)
	if err != nil {
		return nil, nil, nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 5 * time.Minute}
	return srv.Serve, store, func() { _ = srv.Close(); closeFn() }, nil
}

// quietLogger drops idem's log records (store failures, take-overs): the
// systems are measured without logging, as the bare handler runs.
var quietLogger = slog.New(slog.DiscardHandler)

// buildHandler returns the net/http handler of a system and its store.
func buildHandler(ctx context.Context, o serverOpts, g *gate) (http.Handler, idemstore.Store, func(), error) {
	noop := func() {}
	mux := http.NewServeMux()
	if o.system == sysBare {
		mux.HandleFunc(patternCreate, appHandler)
		mux.HandleFunc("POST "+pathSlow, g.slowHandler)
		return mux, nil, noop, nil
	}
	var (
		store   idemstore.Store
		closeFn = noop
	)
	switch o.system {
	case sysMem:
		s, err := memstore.New(&memstore.Config{MaxRecords: 1 << 24})
		if err != nil {
			return nil, nil, nil, err
		}
		store = s
	case sysSQLite:
		s, err := sqlitestore.Open(ctx, o.sqlitePath, nil)
		if err != nil {
			return nil, nil, nil, err
		}
		store, closeFn = s, func() { _ = s.Close() }
	case sysPG:
		cfg, err := pgxpool.ParseConfig(o.pgURL)
		if err != nil {
			return nil, nil, nil, err
		}
		cfg.MaxConns = int32(o.pgConns)
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, nil, nil, err
		}
		s, err := pgstore.New(ctx, pool, &pgstore.Config{Schema: o.pgSchema})
		if err != nil {
			pool.Close()
			return nil, nil, nil, err
		}
		store, closeFn = s, pool.Close
	case sysRedis:
		opts, err := redis.ParseURL(o.redisURL)
		if err != nil {
			return nil, nil, nil, err
		}
		opts.PoolSize = 160 // more than the most workers: the pool is not what is measured
		redisstore.RecommendOptions(opts)
		client := redis.NewClient(opts)
		s, err := redisstore.New(client, &redisstore.Config{Prefix: o.redisPrefix})
		if err != nil {
			client.Close()
			return nil, nil, nil, err
		}
		store, closeFn = s, func() { _ = client.Close() }
	default:
		return nil, nil, nil, fmt.Errorf("unknown system %q", o.system)
	}
	req := idem.KeyOptional
	if o.check {
		req = idem.KeyByMethod
	}
	mw, err := idem.NewMiddleware(store, &idem.Config{Requirement: req, Logger: quietLogger})
	if err != nil {
		closeFn()
		return nil, nil, nil, err
	}
	mux.Handle(patternCreate, mw.Handle(http.HandlerFunc(appHandler)))
	mux.Handle("POST "+pathSlow, mw.Handle(http.HandlerFunc(g.slowHandler)))
	return mux, store, closeFn, nil
}

// fiberApp is the Fiber v3 application: the same answer as appHandler,
// with or without Fiber's idempotency middleware (memory storage and lock,
// its defaults, on the standard header name so that idem check can grade
// it, accepting any key).
func fiberApp(withIdem bool, g *gate) *fiber.App {
	app := fiber.New()
	if withIdem {
		app.Use(fiberidem.New(fiberidem.Config{
			KeyHeader: idem.HeaderKey,
			KeyHeaderValidate: func(k string) error {
				if k == "" || len(k) > 255 {
					return errors.New("invalid key")
				}
				return nil
			},
		}))
	}
	handler := func(c fiber.Ctx) error {
		c.Set("Content-Type", "application/json")
		return c.Status(http.StatusCreated).Send(appBody(len(c.Body())))
	}
	app.Post(pathPayments, handler)
	app.Post(pathSlow, func(c fiber.Ctx) error {
		t := time.NewTimer(maxSlow)
		defer t.Stop()
		release := g.wait()
		g.enter()
		select {
		case <-release:
		case <-t.C:
		}
		return handler(c)
	})
	return app
}

// readReady reads the ready line of a serve-system (or plain-payments)
// process.
func readReady(r *bufio.Reader) (ready, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return ready{}, fmt.Errorf("reading the ready line: %w", err)
	}
	var rd ready
	if err := json.Unmarshal(line, &rd); err != nil {
		return ready{}, fmt.Errorf("ready line %q: %w", line, err)
	}
	return rd, nil
}
