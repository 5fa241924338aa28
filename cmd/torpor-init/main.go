// Command torpor-init is the small binary a worker re-executes inside each
// new sandbox (the sandbox init) and around each snapshot engine run
// (cgexec). It holds nothing else, so that it starts in about a millisecond
// where the full torpor binary takes ~10 ms to initialize: that is paid on
// every cold start, checkpoint and restore. scripts/install.sh installs it
// beside torpor, where the worker looks for it (sandbox.FindInit).
package main

import (
	"fmt"
	"os"

	"github.com/torpor-dev/torpor/internal/sandbox"
)

func main() {
	if sandbox.IsInit() {
		sandbox.InitMain() // never returns
	}
	if len(os.Args) == 2 && os.Args[1] == "--init-version" {
		fmt.Println(sandbox.InitVersion)
		return
	}
	fmt.Fprintln(os.Stderr, "torpor-init is started by a torpor worker, not by hand")
	os.Exit(2)
}
