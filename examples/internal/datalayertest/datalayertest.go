// Package datalayertest proves, for one data-layer example on every
// backend, that the order and the idempotency record commit together or not
// at all, with real processes:
//
//   - a server process killed with SIGKILL after the handler's write and
//     before the commit leaves neither the order nor a stored response
//     (with Config.ClaimInTx, no record at all);
//   - the retry that follows creates the order and stores the response,
//     both;
//   - a second retry replays the stored response byte for byte and writes
//     nothing.
//
// The server is the test binary itself, started again with the
// IDEM_DATALAYER_CHILD environment variable (see Main). The kill lands in a
// window the child opens on purpose: its PhaseObserver blocks when the
// completion phase starts, after the handler returned and before the
// store completes the record and commits.
//
// Each run also sends the library's writes outside the execution's
// transaction (through a transaction of its own on the same pool) and
// requires the check to fail: a test that passed that variant would prove
// nothing.
package datalayertest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/examples/internal/datalayer"
)

// childEnv carries a child's spec (JSON) to the re-executed test binary.
const childEnv = "IDEM_DATALAYER_CHILD"

// lease is the children's Config.Lease: short, so that a retry can take
// over the record a killed child left in flight.
const lease = time.Second

// spec tells a child what to serve.
type spec struct {
	Backend   string
	DSN       string
	ClaimInTx bool
	// Crash blocks the first completion (after the handler's write, before
	// the commit) and announces it with the line "complete".
	Crash bool
	// Outside sends the library's writes through a transaction of their
	// own instead of the execution's: the wrong variant.
	Outside bool
}

// Main is the TestMain of a data-layer example: in a child process it
// serves lib as the spec in IDEM_DATALAYER_CHILD says and exits; otherwise
// it runs the tests and fails them if a goroutine outlives them.
func Main(m *testing.M, lib datalayer.Library) {
	if s := os.Getenv(childEnv); s != "" {
		os.Exit(child(s, lib))
	}
	goleak.VerifyTestMain(m)
}

// child serves lib until its standard input closes. It prints "listening
// ADDR" once it accepts requests.
func child(specJSON string, lib datalayer.Library) int {
	var s spec
	if err := json.Unmarshal([]byte(specJSON), &s); err != nil {
		fmt.Fprintln(os.Stderr, "child spec:", err)
		return 2
	}
	b := datalayer.ByName(s.Backend)
	if b == nil {
		fmt.Fprintf(os.Stderr, "child: no backend %q\n", s.Backend)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	db, err := b.Open(ctx, s.DSN)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open:", err)
		return 2
	}
	defer db.Close()
	create, err := lib.Open(db)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open the library:", err)
		return 2
	}
	if s.Outside {
		db, create = outside(db, create)
	}
	cfg := &idem.Config{ClaimInTx: s.ClaimInTx, Lease: lease, Observer: &crashPoint{crash: s.Crash}}
	h, err := datalayer.Handler(db, cfg, create)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: handler:", err)
		return 2
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: listen:", err)
		return 2
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("listening %s\n", ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
	return 0
}

// outside is the wrong variant: create runs in a transaction of its own on
// the application's pool, committed as soon as it returns, and the
// execution's transaction is never begun.
func outside(db *datalayer.DB, create datalayer.Create) (*datalayer.DB, datalayer.Create) {
	wrong := *db
	wrong.Tx = func(context.Context) (*sql.Tx, error) { return nil, nil }
	return &wrong, func(ctx context.Context, _ *sql.Tx, o *datalayer.Order) error {
		own, err := db.SQL.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := create(ctx, own, o); err != nil {
			_ = own.Rollback()
			return err
		}
		return own.Commit()
	}
}

// crashPoint is the child's Observer. With crash set, the first completion
// phase prints "complete" and blocks forever: the parent kills the process
// there, with the handler's writes done and not committed.
type crashPoint struct{ crash bool }

func (c *crashPoint) Observe(context.Context, idem.Event) {}

func (c *crashPoint) StartPhase(ctx context.Context, ph idem.Phase, _ idem.PhaseInfo) (context.Context, func(error)) {
	if c.crash && ph == idem.PhaseComplete {
		fmt.Println("complete")
		select {}
	}
	return ctx, func(error) {}
}

var _ idem.PhaseObserver = (*crashPoint)(nil)
