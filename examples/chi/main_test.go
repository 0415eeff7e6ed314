package main

import (
	"testing"

	"github.com/idemhq/idem/examples/internal/checktest"
)

// idem check passes against this example, with one order per execution.
func TestCheckPasses(t *testing.T) { checktest.Example(t, newHandler) }
