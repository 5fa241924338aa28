package testenv

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/config"
)

// python caches the interpreter lookup: it starts Python, and every test
// that needs Python asks.
var python struct {
	once sync.Once
	path string
	err  string // why there is no path
}

// Python returns the real Python interpreter, resolved behind any pyenv shim
// or symlink as the worker resolves it (a shim costs ~50 ms a start).
// TORPOR_TEST_PYTHON names the interpreter to resolve instead of python3.
// When there is none, t is skipped with the reason — or, in CI (CI set),
// failed, because CI installs Python and must not skip.
func Python(t testing.TB) string {
	t.Helper()
	python.once.Do(func() {
		name := os.Getenv("TORPOR_TEST_PYTHON")
		if name == "" {
			name = "python3"
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		in, err := config.ResolvePython(ctx, name)
		if err != nil {
			python.err = "needs Python 3.8+: " + err.Error() + " (install python3 or set TORPOR_TEST_PYTHON)"
			return
		}
		python.path = in.Path
	})
	if python.path == "" {
		needs(t, python.err)
	}
	return python.path
}
