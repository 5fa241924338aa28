package testenv

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/snapshot/criu"
)

// needs skips t because something it needs is missing, or fails it in CI
// (CI set), where everything tests need is installed and a skip would hide
// that it is not.
func needs(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(why + "; CI must not skip")
	}
	t.Skip(why)
}

// RequireRoot skips t (or fails it in CI) when not running as root:
// sandboxes, cgroups and CRIU need it.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		needs(t, "needs root (namespaces, cgroups, CRIU): run the suite as root")
	}
}

var criuEngine struct {
	once sync.Once
	e    *criu.Engine
	err  error
}

// CRIU returns the CRIU engine the worker would use (TORPOR_CRIU names
// another binary), skipping t (or failing it in CI) when there is none:
// scripts/install-criu.sh installs it.
func CRIU(t testing.TB) *criu.Engine {
	t.Helper()
	RequireRoot(t)
	criuEngine.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		criuEngine.e, criuEngine.err = criu.New(ctx, os.Getenv("TORPOR_CRIU"), "")
	})
	if criuEngine.err != nil {
		needs(t, "needs CRIU (install it with scripts/install-criu.sh): "+criuEngine.err.Error())
	}
	return criuEngine.e
}
