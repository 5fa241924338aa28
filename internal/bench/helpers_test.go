package bench

import (
	"context"
	"os"
	"sync"
	"testing"

	"github.com/torpor-dev/torpor/internal/config"
)

var (
	pythonOnce sync.Once
	pythonPath string
	pythonErr  string
)

// requirePython returns the real Python interpreter (resolved behind any
// pyenv shim) or skips t with the reason. TORPOR_TEST_PYTHON overrides
// the interpreter.
func requirePython(t testing.TB) string {
	t.Helper()
	pythonOnce.Do(func() {
		name := os.Getenv("TORPOR_TEST_PYTHON")
		if name == "" {
			name = "python3"
		}
		py, err := config.ResolvePython(context.Background(), name)
		if err != nil {
			pythonErr = "no usable Python for the baseline server: " + err.Error() + " (install python3 or set TORPOR_TEST_PYTHON)"
			return
		}
		pythonPath = py.Path
	})
	if pythonPath == "" {
		t.Skip(pythonErr)
	}
	return pythonPath
}
