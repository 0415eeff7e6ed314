package pgstore_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/idemstore"
	"github.com/idemhq/idem/pgstore"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
)

// freezer forwards TCP connections to PostgreSQL and can stop forwarding
// while keeping them open: a server that stopped answering.
type freezer struct {
	ln      net.Listener
	mu      sync.Mutex
	conns   []net.Conn
	thaw    chan struct{} // closed while not frozen
	closed  bool
	running sync.WaitGroup
	// atCommit makes freezeAtCommit's transactions freeze.
	atCommit atomic.Bool
}

func newFreezer(t *testing.T, upstream string) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{ln: ln, thaw: make(chan struct{})}
	close(f.thaw)
	f.running.Add(1)
	go func() {
		defer f.running.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.DialTimeout("tcp", upstream, 5*time.Second)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, u)
			f.mu.Unlock()
			f.running.Add(2)
			go f.pump(u, c)
			go f.pump(c, u)
		}
	}()
	t.Cleanup(f.close)
	return f
}

// pump copies src to dst, holding every chunk back while frozen.
func (f *freezer) pump(dst, src net.Conn) {
	defer f.running.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f.mu.Lock()
			thaw := f.thaw
			f.mu.Unlock()
			<-thaw
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.thaw = make(chan struct{})
}

func (f *freezer) close() {
	f.mu.Lock()
	if !f.closed {
		f.closed = true
		select {
		case <-f.thaw:
		default:
			close(f.thaw)
		}
		for _, c := range f.conns {
			c.Close()
		}
	}
	f.mu.Unlock()
	f.ln.Close()
	f.running.Wait()
}

// freezeAtCommit is the Store whose transactions freeze the server just
// before they commit (after the completion).
type freezeAtCommit struct {
	*pgstore.Store
	fz *freezer
}

func (s freezeAtCommit) BeginTx(ctx context.Context) (idemstore.Tx, error) {
	tx, err := s.Store.BeginTx(ctx)
	if err != nil {
		return nil, err
	}
	return freezingTx{tx, s.fz}, nil
}

type freezingTx struct {
	idemstore.Tx
	fz *freezer
}

func (t freezingTx) Commit(ctx context.Context) error {
	if t.fz.atCommit.Load() {
		t.fz.freeze()
	}
	return t.Tx.Commit(ctx)
}

// urlVia returns the test server's URL with its host replaced by hostport.
func urlVia(t *testing.T, hostport string) string {
	t.Helper()
	u, err := url.Parse(postgresURL())
	if err != nil {
		t.Fatal(err)
	}
	u.Host = hostport
	return u.String()
}

// A server that stops answering turns every store call, on pgx and on
// database/sql, into a 503 within StoreTimeout: the claim, and the
// completion and commit of the handler's transaction (with a claim of its
// own and in the claim's transaction). "commit" freezes the server between
// the completion and COMMIT, which database/sql sends without a context of
// its own.
func TestFrozenServerAnswers503(t *testing.T) {
	t.Parallel()
	for _, stage := range []string{"claim", "complete", "commit", "claim-in-tx", "complete-in-tx"} {
		t.Run(stage, func(t *testing.T) {
			t.Parallel()
			eachMode(t, func(t *testing.T, mode string) { testFrozen(t, mode, stage) })
		})
	}
}

func testFrozen(t *testing.T, mode, stage string) {
	f := newFixture(t, nil) // migrates on a direct connection
	upstream, err := url.Parse(postgresURL())
	if err != nil {
		t.Fatal(err)
	}
	fz := newFreezer(t, upstream.Host)
	raw := urlVia(t, fz.ln.Addr().String())
	cfg := &pgstore.Config{Schema: f.schema, SkipMigrate: true}
	var store *pgstore.Store
	if mode == modeSQL {
		pc, err := pgx.ParseConfig(raw)
		if err != nil {
			t.Fatal(err)
		}
		db := stdlib.OpenDB(*pc)
		db.SetMaxOpenConns(4)
		db.SetMaxIdleConns(4)
		t.Cleanup(func() { _ = db.Close() })
		store, err = pgstore.NewDB(t.Context(), db, cfg)
		if err != nil {
			t.Fatal(err)
		}
	} else {
		pc, err := pgxpool.ParseConfig(raw)
		if err != nil {
			t.Fatal(err)
		}
		pc.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(t.Context(), pc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		store, err = pgstore.New(t.Context(), pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
	}
	// Unfreeze and cut the connections before the pool or DB closes
	// (cleanups run last first), so that closing does not wait on them.
	t.Cleanup(fz.close)
	payments := businessTable(t, f)
	var mwStore idemstore.Store = store
	if stage == "commit" {
		mwStore = freezeAtCommit{store, fz}
	}
	mw, err := idem.NewMiddleware(mwStore, &idem.Config{
		StoreTimeout: time.Second,
		ClaimInTx:    strings.HasSuffix(stage, "-in-tx"),
		Logger:       slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	freezeInHandler := strings.HasPrefix(stage, "complete")
	srv := httptest.NewServer(mw.Handle(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idem.InfoFromContext(r.Context())
		tx, err := idem.TxFromContext(r.Context())
		if err == nil {
			err = nativeExec(r.Context(), tx.Native(), "INSERT INTO "+payments+" (idem_key, amount) VALUES ($1, 1)", info.Key)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if freezeInHandler && info.Key == "frozen" {
			fz.freeze()
		}
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	post := func(key string) int {
		t.Helper()
		// Without the store's bounds the request would never end.
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, "POST", srv.URL, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", `"`+key+`"`)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if code := post("warm"); code != http.StatusCreated {
		t.Fatalf("before the freeze: %d, want 201", code)
	}
	switch {
	case stage == "commit":
		fz.atCommit.Store(true)
	case !freezeInHandler:
		fz.freeze()
	}
	start := time.Now()
	code := post("frozen")
	if el := time.Since(start); el > 15*time.Second {
		t.Errorf("answered after %v; StoreTimeout is 1s", el)
	}
	if code != http.StatusServiceUnavailable {
		t.Errorf("frozen server: %d, want 503", code)
	}
}
