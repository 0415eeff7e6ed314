package main

import (
	"testing"

	"github.com/idemhq/idem/examples/internal/datalayertest"
)

func TestMain(m *testing.M) { datalayertest.Main(m, library) }

// An order written through GORM commits with its idempotency record, or
// neither does (a SIGKILL between the write and the commit), and a retry
// replays without a second order.
func TestBothOrNeither(t *testing.T) { datalayertest.Run(t, library) }
