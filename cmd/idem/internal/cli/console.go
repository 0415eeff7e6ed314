package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/idemhq/idem"
	"github.com/idemhq/idem/cmd/idem/internal/backend"
	"github.com/idemhq/idem/cmd/idem/internal/console"
)

const consoleAbout = `Runs the operator console: web pages over a records store (a SQLite file,
postgres://, redis://, redis+cluster://). The overview counts records by
state (in flight, suspended after a step, completed, expired awaiting
cleanup), shows the oldest in-flight lease and the outbox backlog; Records
lists and filters them (state, scope, age) a page at a time; a record's page
shows its lease, fence, steps and stored response fields (bodies only with
--show-body); actions, each confirmed and logged: delete a completed record,
release an in-flight one whose owner is gone, retry an outbox message now.

It listens on 127.0.0.1:8089 by default. Any other than a loopback address
needs --console-token-file: every page then asks for that token (as a bearer
token, or typed into the login form). Keys never appear in the console's
URLs: records are named by a SHA-256 of their scope and key. The same pages
run inside idem serve and idem proxy with --console-addr. See docs/console.md.`

// consoleFlags are the flags the console shares with serve and proxy.
type consoleFlags struct {
	tokenFile *string
	showBody  *bool
}

func (f *flags) consoleTokenFlag() *string {
	return f.String("console-token-file", "", "file holding the console's token (at least 16 characters): every\nconsole page then needs it, as a bearer token or through the login\nform; required to listen on any other than a loopback address")
}

// serverConsoleFlags are serve's and proxy's console flags.
type serverConsoleFlags struct {
	addr *string
	consoleFlags
}

func (f *flags) serverConsoleFlags() serverConsoleFlags {
	return serverConsoleFlags{
		addr: f.String("console-addr", "", "serve the operator console (see idem console) on this address, with\nthis process's live rates; default: off. A loopback address unless\n--console-token-file is given"),
		consoleFlags: consoleFlags{
			tokenFile: f.consoleTokenFlag(),
			showBody:  f.Bool("console-show-body", false, "let the console show stored response bodies and step data (they may\nhold personal data)"),
		},
	}
}

// check validates the console flags before anything is opened, and
// returns the token ("" without a file). addr "" means no console.
func (cf consoleFlags) check(flagName, addr string, warn func(string)) (string, error) {
	token := ""
	if *cf.tokenFile != "" {
		t, warning, err := console.LoadToken(*cf.tokenFile)
		if err != nil {
			return "", fmt.Errorf("--console-token-file: %w", err)
		}
		if warning != "" {
			warn(warning)
		}
		token = t
	}
	if addr == "" {
		return token, nil
	}
	if err := console.CheckAddr(addr, token != ""); err != nil {
		return "", fmt.Errorf("--%s: %w", flagName, err)
	}
	return token, nil
}

func runConsole(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newFlags("console", consoleAbout, stdout, stderr)
	store := storeFlag(f)
	addr := f.String("addr", "127.0.0.1:8089", "address to listen on (host:port; port 0 picks a free port); any other\nthan a loopback address needs --console-token-file")
	cf := consoleFlags{tokenFile: f.consoleTokenFlag(),
		showBody: f.Bool("show-body", false, "show stored response bodies and step data (they may hold personal data)")}
	encKeys := f.encryptionFlag()
	ttl := f.Duration("ttl", idem.DefaultTTL, "the --ttl the records were written with: a record's claim time is\nits expiry minus it, and the age filter counts from it")
	logFormat := f.String("log-format", "text", "log format: text or json")
	if code, ok := f.parse(args); !ok {
		return code
	}
	if len(f.positional()) > 0 {
		return f.usageError("unexpected argument %q", f.positional()[0])
	}
	if err := positiveDuration("ttl", *ttl, false); err != nil {
		return f.usageError("%v", err)
	}
	logger, err := newLogger(*logFormat, stderr)
	if err != nil {
		return f.usageError("%v", err)
	}
	token, err := cf.check("addr", *addr, func(msg string) { logger.Warn(msg) })
	if err != nil {
		fmt.Fprintf(stderr, "idem console: %v\n", err)
		return exitUsage
	}
	enc, _, err := loadEncryption(*encKeys, nil, func(msg string) { logger.Warn(msg, "file", *encKeys) })
	if err != nil {
		fmt.Fprintf(stderr, "idem console: --encryption-keys: %v\n", err)
		return exitError
	}
	kind, err := backend.KindOf(*store)
	if err != nil {
		return f.usageError("--store: %v", err)
	}
	switch kind {
	case backend.Memory:
		return f.usageError(`--store: "memory" lives inside one process; point --store at a SQLite file, postgres:// or redis://, or use --console-addr on idem serve or idem proxy`)
	case backend.SQLite:
		// Opening a missing path would create an empty database.
		if _, err := os.Stat(*store); err != nil {
			fmt.Fprintf(stderr, "idem console: SQLite store: %v\n", err)
			return exitError
		}
	}
	s, err := backend.Open(ctx, *store)
	if err != nil {
		logger.Error("cannot open the store", "store", *store, "error", err)
		return exitError
	}
	defer closeStore(s, logger)
	c, err := console.New(ctx, console.Config{Store: s, Spec: *store, Encryption: enc, ShowBody: *cf.showBody,
		Token: token, TTL: *ttl, Logger: logger})
	if err != nil {
		logger.Error("cannot start the console", "error", err)
		return exitError
	}
	defer c.Close()
	ln, err := listenConsole(*addr, token)
	if err != nil {
		logger.Error("cannot listen", "addr", *addr, "error", err)
		return exitError
	}
	logger.Info("idem console listening", "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String(),
		"store", s.Where, "token", token != "", "show_body", *cf.showBody)
	if err := serveHTTP(ctx, ln, accessLog(logger, true, c.Handler()), logger, consoleExtraWrite, defaultShutdownTimeout); err != nil {
		logger.Error("server stopped", "error", err)
		return exitError
	}
	logger.Info("stopped")
	return exitOK
}

// consoleExtraWrite is added to the console server's write timeout: a
// reconcile action runs the operation (its provider budget) before the
// page answers.
const consoleExtraWrite = time.Minute

// listenConsole listens on addr and checks, without a token, that the
// address it got is a loopback one ("localhost" may resolve elsewhere).
func listenConsole(addr, token string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if err := console.CheckListener(ln, token != ""); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// startConsole serves c on its own listener (serve's and proxy's
// --console-addr) until ctx ends; the returned function waits for it.
func startConsole(ctx context.Context, ln net.Listener, c *console.Console, logger *slog.Logger, accessLogOn bool, grace time.Duration) func() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := serveHTTP(ctx, ln, accessLog(logger, accessLogOn, c.Handler()), logger, consoleExtraWrite, grace)
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("the console stopped", "error", err)
		}
	}()
	return func() { <-done; c.Close() }
}

// serveConsole starts the console of serve or proxy on addr until ctx
// ends; the returned function stops it (at once, if ctx has not ended:
// the process is exiting) and waits for it. A failure is logged.
func serveConsole(ctx context.Context, cfg console.Config, addr, token string, logger *slog.Logger, accessLogOn bool, grace time.Duration) (func(), error) {
	c, err := console.New(ctx, cfg)
	if err != nil {
		logger.Error("cannot start the console", "error", err)
		return nil, err
	}
	ln, err := listenConsole(addr, token)
	if err != nil {
		c.Close()
		logger.Error("cannot listen", "console_addr", addr, "error", err)
		return nil, err
	}
	logger.Info("console listening", "console_addr", ln.Addr().String(), "url", "http://"+ln.Addr().String(), "token", token != "")
	ctx, cancel := context.WithCancel(ctx)
	wait := startConsole(ctx, ln, c, logger, accessLogOn, grace)
	return func() { cancel(); wait() }, nil
}
