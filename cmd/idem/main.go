// Command idem makes HTTP APIs safe to retry: `idem serve` runs the
// payments demo, `idem proxy` puts the Idempotency-Key contract in front of
// any HTTP API, `idem check` grades an API against it, and `idem cleanup`
// deletes expired records. Run `idem --help` for details.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/idemhq/idem/cmd/idem/internal/cli"
)

func main() {
	// SIGTERM and SIGINT start a graceful shutdown: in-flight requests
	// finish and complete their records. A second signal kills at once.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	go func() {
		<-ctx.Done()
		stop()
	}()
	os.Exit(cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr))
}
