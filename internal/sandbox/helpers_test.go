package sandbox

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestMain lets the test binary serve as the in-sandbox init
// (InitPath defaults to /proc/self/exe), as cmd/torpor does.
func TestMain(m *testing.M) {
	if IsInit() {
		InitMain()
	}
	os.Exit(m.Run())
}

// requireRoot skips t when not running as root: sandboxes need namespaces,
// mounts and cgroups. In CI (CI set) it fails instead: nothing skips there.
func requireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			tb.Fatal("needs root (namespaces, mounts, cgroups) and CI must not skip: run the suite as root")
		}
		tb.Skip("needs root (namespaces, mounts, cgroups); CI runs these as root")
	}
}

// nextUID hands each sandbox of the test run its own uid, so that one
// test's processes cannot count against another's per-uid limits.
var nextUID atomic.Int64

func testUID() int { return 61000 + int(nextUID.Add(1)) }

// testConfig returns a Config with a fresh state dir and a cgroup name no
// other test (or a concurrently running worker) uses. On cgroup v1 the name
// is relative (nested under the test's own cgroups); on v2 it is absolute,
// because `go test` shares its cgroup with the go command, so that cgroup
// cannot delegate controllers.
func testConfig(t testing.TB) Config {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "torpor-test-" + hex.EncodeToString(b)
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		mounts, _ := parseMountinfo(f)
		f.Close()
		if l, err := detectCgroups(mounts); err == nil && l.Version == 2 {
			name = "/" + name
		}
	}
	return Config{StateDir: t.TempDir(), CgroupName: name}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// newTestManager returns a Manager that is closed (all sandboxes destroyed,
// parent cgroups removed) when t ends.
func newTestManager(t *testing.T) *Manager {
	t.Helper()
	requireRoot(t)
	m, err := NewManager(context.Background(), testConfig(t), testLogger(t))
	if err != nil {
		t.Fatalf("NewManager: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := m.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

// shSpec returns a spec running script under /bin/sh as a fresh uid.
func shSpec(id, script string) Spec {
	uid := testUID()
	return Spec{
		ID:     id,
		UID:    uid,
		GID:    uid,
		Argv:   []string{"/bin/sh", "-c", script},
		Env:    []string{"PATH=/usr/bin:/bin"},
		Limits: Limits{MemoryMB: 64, Pids: 64, CPUShares: 1024, TmpMB: 8},
	}
}

// outcome is what a sandbox printed and how it ended.
type outcome struct {
	stdout, stderr string
	status         ExitStatus
}

// runSandbox starts spec with captured stdout and stderr, waits (at most
// 20s) for it to exit, destroys it and returns what it printed.
func runSandbox(t *testing.T, m *Manager, spec Spec) outcome {
	t.Helper()
	s, out, errs := startCaptured(t, m, spec)
	select {
	case <-s.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("sandbox %s did not exit", spec.ID)
	}
	destroy(t, s)
	return outcome{stdout: out(), stderr: errs(), status: s.ExitStatus()}
}

// startCaptured starts spec with stdout and stderr going to pipes; the
// returned functions read each to EOF (that is, until the sandbox is gone).
func startCaptured(t *testing.T, m *Manager, spec Spec) (*Sandbox, func() string, func() string) {
	t.Helper()
	outR, outW := pipe(t)
	errR, errW := pipe(t)
	spec.Stdout, spec.Stderr = outW, errW
	s, err := m.Start(context.Background(), spec)
	outW.Close()
	errW.Close()
	if err != nil {
		t.Fatalf("Start %s: %v", spec.ID, err)
	}
	t.Cleanup(func() { destroy(t, s) })
	return s, readAllFunc(outR), readAllFunc(errR)
}

func readAllFunc(r io.Reader) func() string {
	ch := make(chan string, 1)
	go func() {
		var b bytes.Buffer
		_, _ = io.Copy(&b, r)
		ch <- b.String()
	}()
	var got *string
	return func() string {
		if got == nil {
			s := <-ch
			got = &s
		}
		return *got
	}
}

func pipe(t testing.TB) (*os.File, *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

func destroy(t testing.TB, s *Sandbox) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Destroy(ctx); err != nil {
		t.Errorf("Destroy: %v", err)
	}
}

// exists reports whether p exists on the host.
func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
