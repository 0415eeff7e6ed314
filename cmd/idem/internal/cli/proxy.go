package cli

import (
	"context"
	"fmt"
	"io"
)

func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "idem proxy: not built yet")
	return exitError
}
