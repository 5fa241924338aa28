package criu_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// TestMain lets the test binary serve as the sandbox init and cgexec.
func TestMain(m *testing.M) {
	if sandbox.IsInit() {
		sandbox.InitMain()
	}
	os.Exit(m.Run())
}

// dirSink writes image files into a directory.
type dirSink struct{ dir string }

func (d dirSink) Open(name string) (io.WriteCloser, error) {
	return os.OpenFile(filepath.Join(d.dir, name), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
}

var uidSeq atomic.Int64

func newManager(t *testing.T) *sandbox.Manager {
	t.Helper()
	testenv.RequireRoot(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	m, err := sandbox.NewManager(context.Background(), sandbox.Config{StateDir: t.TempDir(), CgroupName: "torpor-test-" + hex.EncodeToString(b)}, testenv.Logger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = m.Close(ctx)
	})
	return m
}

func readCount(t *testing.T, pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/root/tmp/count")
	if err != nil {
		return -1
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func TestCheckpointRestoreShell(t *testing.T) {
	m := newManager(t)
	e := testenv.CRIU(t)
	ctx := testenv.Ctx(t)
	uid := 62000 + int(uidSeq.Add(1))
	spec := sandbox.Spec{
		ID: "ckpt-src", UID: uid, GID: uid,
		Argv:   []string{"/bin/sh", "-c", `i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.02; done`},
		Env:    []string{"PATH=/usr/bin:/bin"},
		Limits: sandbox.Limits{MemoryMB: 64, Pids: 64, TmpMB: 8},
	}
	src, err := m.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "counter starts", func() bool { return readCount(t, src.Pid()) > 3 })
	imgs := t.TempDir()
	// Leave the source running: the restored copy then needs the very
	// pids (inside its namespace) that the source still holds.
	st, err := e.Checkpoint(ctx, snapshot.CheckpointSpec{Pid: src.Pid(), LeaveRunning: true, Mounts: m.ExternalMounts(spec),
		WorkDir: t.TempDir(), ExecPrefix: m.ExecPrefix()}, dirSink{imgs})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("dump: %+v", st)
	s0 := readCount(t, src.Pid())
	testenv.Eventually(t, 5*time.Second, "source keeps counting after the dump", func() bool { return readCount(t, src.Pid()) > s0+3 })
	spec.ID = "ckpt-dst"
	var rst snapshot.RestoreStats
	dst, err := m.Restore(ctx, spec, func(ctx context.Context, env sandbox.RestoreEnv) (int, error) {
		var err error
		rst, err = e.Restore(ctx, snapshot.RestoreSpec{ImagesDir: imgs, Root: env.Root, Mounts: env.Mounts, WorkDir: t.TempDir(),
			ExecPrefix: env.ExecPrefix})
		return rst.Pid, err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore: %+v", rst)
	c0 := readCount(t, dst.Pid())
	testenv.Eventually(t, 5*time.Second, "restored counter keeps counting", func() bool { return readCount(t, dst.Pid()) > c0+3 })
	if src.Pid() == dst.Pid() {
		t.Fatalf("source and copy share host pid %d", dst.Pid())
	}
	s1 := readCount(t, src.Pid())
	testenv.Eventually(t, 5*time.Second, "source still counting beside its copy", func() bool { return readCount(t, src.Pid()) > s1+3 })
	// Same pids inside their own namespaces: NSpid's last field is pid 1.
	for _, pid := range []int{src.Pid(), dst.Pid()} {
		st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if !strings.Contains(string(st), "NSpid:\t"+strconv.Itoa(pid)+"\t1\n") {
			t.Errorf("pid %d is not pid 1 of its namespace:\n%s", pid, st)
		}
	}
	cg, _ := os.ReadFile("/proc/" + strconv.Itoa(dst.Pid()) + "/cgroup")
	if !strings.Contains(string(cg), "ckpt-dst") {
		t.Errorf("restored process not in its sandbox's cgroup:\n%s", cg)
	}
}
