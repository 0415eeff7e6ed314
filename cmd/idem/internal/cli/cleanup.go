package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/idemhq/idem/cmd/idem/internal/backend"
)

const cleanupAbout = `Deletes expired idempotency records in bounded batches, so that no single
statement holds a lock for long. Services run it periodically (idem serve and
idem proxy do so themselves, see --cleanup-interval); stores never start
background work on their own. Redis needs no cleanup: keys expire there.`

func runCleanup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f := newFlags("cleanup", cleanupAbout, stdout, stderr)
	store := f.String("store", "idem.db", "the records store: a SQLite file path, a postgres://, mysql:// or redis:// URL")
	batch := f.Int("batch", 1000, "records deleted per statement")
	maxBatches := f.Int("max-batches", 0, "stop after this many batches (0: until none are left)")
	pace := f.Bool("pace", false, "pause after each batch as long as it took, leaving the store to\ntraffic half of the time")
	if code, ok := f.parse(args); !ok {
		return code
	}
	if *batch <= 0 || *maxBatches < 0 {
		return f.usageError("--batch must be positive and --max-batches not negative")
	}
	s, err := backend.Open(ctx, *store)
	if err != nil {
		fmt.Fprintf(stderr, "idem cleanup: %v\n", err)
		return exitError
	}
	defer s.Close()
	n, err := deleteExpired(ctx, s.Records, *batch, *maxBatches, *pace)
	fmt.Fprintf(stdout, "deleted %d expired records from %s\n", n, s.Where)
	if err != nil {
		fmt.Fprintf(stderr, "idem cleanup: %v\n", err)
		return exitError
	}
	return exitOK
}
