//go:build !amd64

package sandbox

import (
	"fmt"
	"runtime"
)

// installSeccomp fails: the filter's table of system call numbers (see
// seccomp.go) exists for linux/amd64 only, and a sandbox without it would
// leave unshare(CLONE_NEWUSER) and the rest of the deny-list open to
// hostile functions. A port needs the architecture's numbers and
// AUDIT_ARCH_* value, and the tests in seccomp_test.go run on it.
func installSeccomp() error {
	return fmt.Errorf("no seccomp filter for %s yet: run sandboxes on linux/amd64", runtime.GOARCH)
}
