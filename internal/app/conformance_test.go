package app_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/torpor-dev/torpor/internal/callstore"
	"github.com/torpor-dev/torpor/internal/config"
	"github.com/torpor-dev/torpor/internal/dispatch"
	"github.com/torpor-dev/torpor/internal/gateway"
	"github.com/torpor-dev/torpor/internal/gateway/gatewaytest"
	"github.com/torpor-dev/torpor/internal/registry"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/testenv"
	"github.com/torpor-dev/torpor/internal/worker"
)

// TestMain lets the test binary serve as the in-sandbox init: sandboxes
// re-exec /proc/self/exe, as they re-exec the torpor binary.
func TestMain(m *testing.M) {
	if sandbox.IsInit() {
		sandbox.InitMain()
	}
	os.Exit(m.Run())
}

// TestBackendConformance holds the real backend — the dispatcher, with a
// worker running calls in sandboxes in the same process, on an embedded
// bus — to gateway.Backend's contract, as the fake is held to it.
func TestBackendConformance(t *testing.T) {
	requireRoot(t)
	testenv.Python(t) // skips (or, in CI, fails) first when there is no Python
	gatewaytest.RunBackendConformance(t, func(t *testing.T) gateway.Backend { return newBackend(t) })
}

// newBackend wires a backend as app.Run does with both roles, on a fresh
// home; everything is shut down, in reverse order, when t ends.
func newBackend(t *testing.T) *dispatch.Dispatcher {
	t.Helper()
	log := testenv.Logger(t)
	py, err := config.ResolvePython(testenv.Ctx(t), testenv.Python(t))
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	b := testenv.Bus(t)
	runCtx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	reg, err := registry.New(runCtx, b.Functions, b.Code, log.With("part", "registry"))
	if err != nil {
		t.Fatalf("registry.New: %v", err)
	}
	calls := callstore.New(b.Calls)

	sbm, err := sandbox.NewManager(testenv.Ctx(t), sandbox.Config{StateDir: filepath.Join(home, "sandbox"),
		CgroupName: testCgroupName()}, log.With("part", "sandbox"))
	if err != nil {
		t.Fatalf("sandbox.NewManager: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := sbm.Close(ctx); err != nil {
			t.Errorf("close sandboxes: %v", err)
		}
	})
	w, err := worker.New(testenv.Ctx(t), worker.Config{ID: "w-test", Home: home, Python: py.Path, PythonHome: py.Prefix},
		b, reg, calls, sbm, worker.NewMetrics(prometheus.NewRegistry()), log.With("part", "worker"))
	if err != nil {
		t.Fatalf("worker.New: %v", err)
	}
	if err := w.Start(runCtx); err != nil {
		t.Fatalf("worker Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		w.Close(ctx)
	})
	dir, err := dispatch.NewDirectory(runCtx, b, reg, log.With("part", "directory"))
	if err != nil {
		t.Fatalf("dispatch.NewDirectory: %v", err)
	}
	return dispatch.New(b, reg, calls, w, dir, log.With("part", "dispatch"))
}

// requireRoot skips t when not running as root (sandboxes need namespaces,
// mounts and cgroups); in CI, where nothing may skip, it fails instead.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root (namespaces, mounts, cgroups) and CI must not skip: run the suite as root")
		}
		t.Skip("needs root (namespaces, mounts, cgroups); CI runs this as root")
	}
}

// testCgroupName is a parent cgroup no other test or worker uses. Under
// cgroup v1 it is relative (nested in the test's own cgroups); under v2 it
// is absolute, because `go test` shares its cgroup with the go command, so
// that cgroup cannot delegate controllers.
func testCgroupName() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "torpor-test-" + hex.EncodeToString(b)
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err == nil && !strings.Contains(string(mi), " - cgroup ") {
		name = "/" + name // no v1 hierarchy: v2 only
	}
	return name
}
