//go:build !linux

package e2e

import "os/exec"

// killWithParent is a no-op outside Linux: only the test's cleanups stop
// the processes there.
func killWithParent(*exec.Cmd) {}
