//go:build !linux

package bench

import "os/exec"

// setPdeathsig is a no-op where the kernel has no parent-death signal.
func setPdeathsig(*exec.Cmd) {}
