package e2e

import (
	"os/exec"
	"syscall"
)

// killWithParent makes the kernel kill the child if the test process dies
// (a panic, a -timeout, a kill), so that no idem process outlives the run
// even when the cleanups cannot run. The signal follows the forking
// thread, which the Go runtime keeps alive (this package never locks
// goroutines to threads).
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
