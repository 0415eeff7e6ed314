// Package cli implements the idem command: one binary, with subcommands.
package cli

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idemhq/idem"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"serve", "run the payments demo service (SQLite by default)", runServe},
		{"proxy", "run a reverse proxy that makes any HTTP API retry-safe", runProxy},
		{"provider", "run a card-provider simulator with faults (for serve --provider)", runProvider},
		{"check", "grade an HTTP endpoint against the Idempotency-Key contract", runCheck},
		{"cleanup", "delete expired idempotency records in batches", runCleanup},
		{"inspect", "show the idempotency record of a key", runInspect},
		{"ls", "list idempotency records", runLs},
		{"delete", "delete the idempotency record of a key", runDelete},
		{"console", "run the operator console: web pages over a records store", runConsole},
		{"consume", "book payment events into a ledger exactly once (inbox demo)", runConsume},
		{"version", "print the version", runVersion},
	}
}

// Version is set at build time with -ldflags "-X ...cli.Version=...".
var Version = "dev"

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// Main runs the idem command with args (without the program name) and
// returns the process exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "idem: unknown command %q\n\n", args[0])
	usage(stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprint(w, `idem makes HTTP APIs safe to retry (the Idempotency-Key pattern).

Usage: idem <command> [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run "idem <command> --help" for a command's flags. Every flag can also be set
with an environment variable: IDEM_ followed by the flag name in upper case,
with dashes as underscores (--op-delay is IDEM_OP_DELAY). A flag given on the
command line wins over the environment.
`)
}

func runVersion(_ context.Context, _ []string, stdout, _ io.Writer) int {
	fmt.Fprintln(stdout, "idem", Version)
	return exitOK
}

// flags is a flag set whose flags also read IDEM_* environment variables.
// --help prints the usage on stdout (exit 0); a bad flag is reported on
// stderr with a pointer to --help, not the whole usage.
type flags struct {
	*flag.FlagSet
	about  string
	args   []string // positional arguments, wherever they stood
	stdout io.Writer
	usage  bytes.Buffer // what the flag package's Usage call printed
}

// serverFlags are the flags idem serve and idem proxy share.
type serverFlags struct {
	addr, logFormat *string
	accessLog       *bool
	wait, cleanup   *time.Duration
	shutdown        *time.Duration
	storeTimeout    *time.Duration
	problemBaseURL  *string
}

func (f *flags) serverFlags() serverFlags {
	return serverFlags{
		addr:           f.String("addr", "127.0.0.1:8080", "address to listen on (host:port; port 0 picks a free port)"),
		wait:           f.Duration("wait", 0, "let a duplicate of a running request wait up to this long for its\nresponse instead of answering 409 at once"),
		logFormat:      f.String("log-format", "text", "log format: text or json"),
		accessLog:      f.Bool("access-log", true, "log one line per request (key redacted); --access-log=false for\nload tests"),
		cleanup:        f.Duration("cleanup-interval", time.Minute, "how often expired records are deleted (0 disables)"),
		storeTimeout:   f.Duration("store-timeout", idem.DefaultStoreTimeout, "bound on each call to the records store (the claim included): a store\nthat does not answer within it gets 503 idempotency.store_unavailable\nwith Retry-After"),
		shutdown:       f.Duration("shutdown-timeout", defaultShutdownTimeout, "on SIGTERM or SIGINT, how long in-flight requests may finish; then\nthe process exits anyway (status 1), whatever its store is doing"),
		problemBaseURL: f.String("problem-base-url", "", "base of the type URL (and Link rel=describedby) of idem's problem\nresponses; the code is appended (default: docs/semantics.md on GitHub)"),
	}
}

func newFlags(name, about string, stdout, stderr io.Writer) *flags {
	f := &flags{FlagSet: flag.NewFlagSet("idem "+name, flag.ContinueOnError), about: about, stdout: stdout}
	f.SetOutput(stderr)
	f.Usage = func() {
		// Kept until parse knows whether help was asked for (stdout) or
		// a flag was wrong (stderr gets a pointer to --help instead).
		out := &f.usage
		fmt.Fprintf(out, "Usage: idem %s [flags]%s\n\n%s\n\nFlags (each also from its environment variable):\n", name, argsHint(name), strings.TrimSpace(about))
		var names []string
		f.VisitAll(func(fl *flag.Flag) { names = append(names, fl.Name) })
		sort.Strings(names)
		for _, n := range names {
			fl := f.Lookup(n)
			def := ""
			if fl.DefValue != "" && fl.DefValue != "0" && fl.DefValue != "0s" && fl.DefValue != "false" && fl.DefValue != "[]" {
				def = fmt.Sprintf(" (default %s)", fl.DefValue)
			}
			fmt.Fprintf(out, "  --%s  [%s]%s\n", fl.Name, envName(fl.Name), def)
			for _, line := range strings.Split(fl.Usage, "\n") {
				fmt.Fprintf(out, "        %s\n", line)
			}
		}
	}
	return f
}

func argsHint(name string) string {
	switch name {
	case "check":
		return " URL"
	case "inspect", "delete":
		return " KEY|ID"
	}
	return ""
}

func envName(flagName string) string {
	return "IDEM_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parse parses args, then fills every flag not given on the command line
// from its environment variable. It returns an exit code and false when the
// command must stop (help, or a usage error already reported).
func (f *flags) parse(args []string) (int, bool) {
	// Flags may come before or after positional arguments
	// (idem check URL --json).
	for {
		if err := f.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				_, _ = f.usage.WriteTo(f.stdout)
				return exitOK, false
			}
			fmt.Fprintf(f.Output(), "Run \"%s --help\" for its flags.\n", f.Name())
			return exitUsage, false
		}
		args = f.Args()
		if len(args) == 0 {
			break
		}
		f.args = append(f.args, args[0])
		args = args[1:]
	}
	set := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	var bad error
	f.VisitAll(func(fl *flag.Flag) {
		if set[fl.Name] || bad != nil {
			return
		}
		if v, ok := os.LookupEnv(envName(fl.Name)); ok {
			if err := fl.Value.Set(v); err != nil {
				bad = fmt.Errorf("invalid value %q for %s: %v", v, envName(fl.Name), err)
			}
		}
	})
	if bad != nil {
		fmt.Fprintf(f.Output(), "idem: %v\n", bad)
		return exitUsage, false
	}
	return exitOK, true
}

// positional returns the arguments that are not flags.
func (f *flags) positional() []string { return f.args }

// usageError reports a bad flag value and returns the usage exit code.
func (f *flags) usageError(format string, args ...any) int {
	fmt.Fprintf(f.Output(), "idem %s: %s\n", strings.TrimPrefix(f.Name(), "idem "), fmt.Sprintf(format, args...))
	return exitUsage
}

// Duration defines a duration flag like flag.FlagSet.Duration, whose
// error for a bad value says what a duration looks like (flag's own says
// "parse error").
func (f *flags) Duration(name string, value time.Duration, usage string) *time.Duration {
	d := value
	f.Var((*durationValue)(&d), name, usage)
	return &d
}

// durationValue is a time.Duration flag.Value.
type durationValue time.Duration

func (d *durationValue) String() string { return (*time.Duration)(d).String() }

func (d *durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return fmt.Errorf("%q has no unit: write a duration such as %ss, 5m or 24h", s, s)
		}
		return fmt.Errorf("%q is not a duration: write one such as 30s, 5m, 1h30m or 24h", s)
	}
	*d = durationValue(v)
	return nil
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, ", ") }

func (m *multiFlag) Set(v string) error {
	*m = append(*m, v)
	return nil
}

// newLogger returns the process logger for --log-format.
func newLogger(format string, w io.Writer) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, not %q", format)
}

// positiveDuration checks a duration flag.
func positiveDuration(name string, d time.Duration, allowZero bool) error {
	if d < 0 || (d == 0 && !allowZero) {
		return fmt.Errorf("--%s must be positive, not %v", name, d)
	}
	return nil
}
