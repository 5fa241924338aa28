package bench

import (
	"os/exec"
	"syscall"
)

// setPdeathsig makes the kernel kill the baseline server if the benchmark
// dies without closing it (e.g. SIGKILL), so no server is left behind.
func setPdeathsig(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
