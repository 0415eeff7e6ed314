package drills_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/internal/drills"
	"github.com/idemhq/idem/pgstore"
	"github.com/idemhq/idem/redisstore"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// newToxiproxy starts an in-process toxiproxy in front of upstream on a
// free loopback port, stopped when tb ends.
func newToxiproxy(tb testing.TB, upstream string) *toxiproxy.Proxy {
	tb.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "drill", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		tb.Fatalf("toxiproxy: %v", err)
	}
	tb.Cleanup(p.Stop)
	return p
}

// fault is one kind of trouble between idem and its store.
type fault struct {
	name string
	json string // the toxic, as toxiproxy's API takes it
}

// faults are the toxics the drills cycle through. "cut after send" lets
// the request reach the store and closes the connection when the answer
// comes back: the store did the write, idem never learns it.
var faults = []fault{
	{"latency", `{"name":"f","type":"latency","stream":"downstream","attributes":{"latency":150,"jitter":150}}`},
	{"reset before send", `{"name":"f","type":"reset_peer","stream":"upstream","attributes":{"timeout":0}}`},
	{"cut after send", `{"name":"f","type":"reset_peer","stream":"downstream","attributes":{"timeout":0}}`},
	{"stall", `{"name":"f","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`},
	{"slow close", `{"name":"f","type":"limit_data","stream":"downstream","attributes":{"bytes":64}}`},
}

// injectFaults cycles through faults, each for phase then a clear phase,
// until ctx ends, and returns how many phases it ran.
func injectFaults(ctx context.Context, tb testing.TB, p *toxiproxy.Proxy, phase time.Duration) int {
	n := 0
	for {
		f := faults[n%len(faults)]
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(f.json)); err != nil {
			tb.Errorf("toxic %s: %v", f.name, err)
			return n
		}
		n++
		done := wait(ctx, phase)
		if err := p.Toxics.RemoveToxic(context.Background(), "f"); err != nil {
			tb.Errorf("removing toxic %s: %v", f.name, err)
		}
		if done || wait(ctx, phase/2) {
			return n
		}
	}
}

// wait waits d and reports whether ctx ended first.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return true
	case <-t.C:
		return false
	}
}

// faultyRedis returns a store on the test Redis through a toxiproxy, with
// timeouts that turn a stalled store into errors within half a second.
func faultyRedis(t *testing.T) (idemstore.Store, *toxiproxy.Proxy) {
	direct := newRedis(t)
	p := newToxiproxy(t, direct.Options().Addr)
	c := redis.NewClient(&redis.Options{Addr: p.Listen, DB: direct.Options().DB, DialTimeout: 300 * time.Millisecond,
		ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	s, err := redisstore.New(c, &redisstore.Config{Prefix: redisPrefix(t, direct)})
	if err != nil {
		t.Fatal(err)
	}
	return s, p
}

// faultyPostgres returns a store on the test PostgreSQL through a
// toxiproxy. The schema is created on a direct connection first.
func faultyPostgres(t *testing.T) (idemstore.Store, *toxiproxy.Proxy) {
	return faultyPostgresIn(t, false)
}

// faultyPostgresSQL is faultyPostgres on database/sql (pgstore.NewDB).
func faultyPostgresSQL(t *testing.T) (idemstore.Store, *toxiproxy.Proxy) {
	return faultyPostgresIn(t, true)
}

func faultyPostgresIn(t *testing.T, viaSQL bool) (idemstore.Store, *toxiproxy.Proxy) {
	direct := newPool(t, postgresURL())
	schema := newSchemaName()
	newPGStore(t, direct, pgstore.Config{Schema: schema})
	cfg, err := pgxpool.ParseConfig(postgresURL())
	if err != nil {
		t.Fatal(err)
	}
	p := newToxiproxy(t, net.JoinHostPort(cfg.ConnConfig.Host, fmt.Sprint(cfg.ConnConfig.Port)))
	host, port, _ := net.SplitHostPort(p.Listen)
	cfg.ConnConfig.Host = host
	fmt.Sscan(port, &cfg.ConnConfig.Port)
	cfg.ConnConfig.ConnectTimeout = 500 * time.Millisecond
	cfg.MaxConns = 8
	if viaSQL {
		db := stdlib.OpenDB(*cfg.ConnConfig)
		db.SetMaxOpenConns(8)
		db.SetMaxIdleConns(8)
		t.Cleanup(func() { _ = db.Close() })
		s, err := pgstore.NewDB(t.Context(), db, &pgstore.Config{Schema: schema})
		if err != nil {
			t.Fatal(err)
		}
		return s, p
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := pgstore.New(t.Context(), pool, &pgstore.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return s, p
}

// Faults injected between idem and its store while clients send new keys
// and duplicates: the handler never runs twice for one key while its lease
// is live (the lease outlasts the test), a replay is always the response
// of that key's one execution, and a request the store could not claim is
// answered 503 without running the handler.
func TestFaultInvariants(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(*testing.T) (idemstore.Store, *toxiproxy.Proxy){
		"Redis": faultyRedis, "PostgreSQL": faultyPostgres, "PostgreSQL-database-sql": faultyPostgresSQL, "MariaDB": faultyMySQL,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, p := open(t)
			checkFaultInvariants(t, store, p)
		})
	}
}

// execution is one run of the handler.
type execution struct {
	key, request, id string
}

func checkFaultInvariants(t *testing.T, store idemstore.Store, p *toxiproxy.Proxy) {
	var (
		mu   sync.Mutex
		runs = map[string][]execution{} // by key
		ran  = map[string]bool{}        // by request id
		seq  atomic.Int64
	)
	mw, err := idem.NewMiddleware(store, &idem.Config{Lease: time.Minute, StoreTimeout: time.Second,
		RetryAfter: time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idem.InfoFromContext(r.Context())
		e := execution{key: info.Key, request: r.Header.Get("X-Request"),
			id: fmt.Sprintf("exec-%d", seq.Add(1))}
		mu.Lock()
		runs[e.key] = append(runs[e.key], e)
		ran[e.request] = true
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]string{"key": e.key, "execution": e.id})
	})))
	t.Cleanup(srv.Close)

	ctx, stop := context.WithTimeout(t.Context(), scale(6*time.Second, 60*time.Second))
	defer stop()
	type reply struct {
		key, request string
		status       int
		replayed     bool
		body         map[string]string
	}
	var (
		replies []reply
		rmu     sync.Mutex
		wg      sync.WaitGroup
	)
	client := &http.Client{Timeout: 30 * time.Second}
	for w := range 6 {
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				// Every third request is a new key; the others repeat one
				// of this worker's recent keys.
				key := fmt.Sprintf("w%d-k%d", w, n/3)
				req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{"amount":1}`))
				req.Header.Set(idem.HeaderKey, `"`+key+`"`)
				req.Header.Set("Content-Type", "application/json")
				id := fmt.Sprintf("w%d-r%d", w, n)
				req.Header.Set("X-Request", id)
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("request %s: %v", id, err)
					return
				}
				r := reply{key: key, request: id, status: resp.StatusCode, replayed: resp.Header.Get(idem.HeaderReplayed) == "true"}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if r.status == http.StatusCreated {
					if err := json.Unmarshal(b, &r.body); err != nil {
						t.Errorf("request %s: body %q: %v", id, b, err)
					}
				}
				rmu.Lock()
				replies = append(replies, r)
				rmu.Unlock()
			}
		})
	}
	phases := injectFaults(ctx, t, p, 400*time.Millisecond)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	counts := map[int]int{}
	for _, r := range replies {
		counts[r.status]++
		switch r.status {
		case http.StatusCreated:
			execs := runs[r.key]
			if len(execs) == 0 || r.body["key"] != r.key || r.body["execution"] != execs[0].id {
				t.Errorf("request %s for key %s got %v; the key's executions: %v", r.request, r.key, r.body, execs)
			}
		case http.StatusServiceUnavailable:
			if ran[r.request] {
				t.Errorf("request %s was answered 503 after its handler ran", r.request)
			}
		case http.StatusConflict:
		default:
			t.Errorf("request %s: unexpected status %d", r.request, r.status)
		}
	}
	for key, execs := range runs {
		if len(execs) > 1 {
			t.Errorf("key %s executed %d times under a live lease: %v", key, len(execs), execs)
		}
	}
	t.Logf("%d fault phases, %d requests, %d keys executed; statuses %v", phases, len(replies), len(runs), counts)
	if counts[http.StatusServiceUnavailable] == 0 || counts[http.StatusCreated] == 0 {
		t.Errorf("statuses %v: the drill needs both executions and refusals to prove anything", counts)
	}
}

// Histories recorded through the same faults stay linearizable: a call
// whose answer was lost is recorded as unknown (it may have taken effect),
// and every answer the store did give fits the contract.
func TestLinearizableUnderFaults(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(*testing.T) (idemstore.Store, *toxiproxy.Proxy){
		"Redis": faultyRedis, "PostgreSQL": faultyPostgres, "PostgreSQL-database-sql": faultyPostgresSQL, "MariaDB": faultyMySQL,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			store, p := open(t)
			ctx, stop := context.WithCancel(t.Context())
			done := make(chan int)
			go func() { done <- injectFaults(ctx, t, p, 150*time.Millisecond) }()
			cfg := serverClockHistory(42, 2*time.Millisecond)
			cfg.Ops, cfg.OpTimeout = scale(30, 200), time.Second
			h := drills.Record(t.Context(), store, cfg)
			stop()
			phases := <-done
			drills.Check(t, "faults", h)
			t.Logf("%d fault phases, %d operations, %d unknown: %v", phases, len(h), drills.Unknowns(h), drills.Outcomes(h))
		})
	}
}
