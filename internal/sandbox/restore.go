package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/snapshot"
)

// ExternalMounts lists the bind mounts a sandbox of spec has — the host's
// system directories, the /dev skeleton and its device nodes, and
// spec.Binds, in mount order — as
// the external mounts of a snapshot: a checkpoint records each by its Key
// (derived from the mount point, so the same on every worker) and a
// restore binds Key to Source, the restoring worker's own path for it (the
// code cache of another $TORPOR_HOME, say).
func (m *Manager) ExternalMounts(spec Spec) []snapshot.Mount {
	var out []snapshot.Mount
	for _, name := range systemDirs {
		host := "/" + name
		if fi, err := os.Lstat(host); err == nil && fi.IsDir() {
			out = append(out, snapshot.Mount{Key: mountKey(host), Target: host, Source: host})
		}
	}
	out = append(out, snapshot.Mount{Key: mountKey("/dev"), Target: "/dev", Source: filepath.Join(m.cfg.StateDir, devSkeletonDir)})
	for _, d := range devNodes {
		p := "/dev/" + d.name
		out = append(out, snapshot.Mount{Key: mountKey(p), Target: p, Source: p})
	}
	for _, b := range spec.Binds {
		out = append(out, snapshot.Mount{Key: mountKey(b.Target), Target: b.Target, Source: b.Source})
	}
	return out
}

// mountKey names a mount target with [a-z0-9-] only: readable, plus a
// hash so that targets differing only in punctuation stay apart.
func mountKey(target string) string {
	var b strings.Builder
	for _, c := range strings.ToLower(strings.Trim(target, "/")) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b.WriteRune(c)
		} else {
			b.WriteByte('-')
		}
	}
	s := b.String()
	if len(s) > 40 {
		s = s[:40]
	}
	sum := sha256.Sum256([]byte(target))
	return s + "-" + hex.EncodeToString(sum[:4])
}

// CheckpointSpec is what the snapshot engine needs to checkpoint sandbox
// s, started from spec, and the labels its snapshot should carry: its
// external mounts, the engine's exec prefix, and whether its network
// namespace may be restored empty.
func (m *Manager) CheckpointSpec(s *Sandbox, spec Spec, leaveRunning bool) (snapshot.CheckpointSpec, map[string]string) {
	var labels map[string]string
	if n, err := InetSockets(s.Pid()); err == nil && n == 0 && !spec.HostNetwork {
		labels = map[string]string{snapshot.LabelNoInetSockets: "true"}
	}
	return snapshot.CheckpointSpec{Pid: s.Pid(), LeaveRunning: leaveRunning, Mounts: m.ExternalMounts(spec), ExecPrefix: m.ExecPrefix()}, labels
}

// RestoreEnv is what Manager.Restore gives the function that recreates an
// instance's process tree (the snapshot engine).
type RestoreEnv struct {
	// Root is an empty directory for the restored root mount.
	Root string
	// ExecPrefix runs a program inside the new sandbox's cgroups: prepend
	// it to the engine's command line so that every restored process is
	// born there, under the sandbox's limits.
	ExecPrefix []string
	// Mounts are spec's external mounts with this host's sources.
	Mounts []snapshot.Mount
}

// Restore creates a sandbox for spec (its cgroup with spec.Limits) around
// a process tree that restore recreates, and returns it like Start does.
// restore must return the host pid of the tree's root, which must be a
// child of this process. spec.Argv is not run.
func (m *Manager) Restore(ctx context.Context, spec Spec, restore func(context.Context, RestoreEnv) (int, error)) (*Sandbox, error) {
	if err := spec.normalize(); err != nil {
		return nil, err
	}
	return m.track("restore", spec.ID, func() (*Sandbox, error) { return m.restore(ctx, spec, restore) })
}

func (m *Manager) restore(ctx context.Context, spec Spec, restore func(context.Context, RestoreEnv) (int, error)) (_ *Sandbox, err error) {
	cg, err := m.cg.create(spec.ID, spec.Limits)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Sandbox, error) {
		// Whatever the engine got as far as creating lives in the cgroup.
		_ = cg.killAll()
		if rerr := cg.remove(context.WithoutCancel(ctx)); rerr != nil {
			m.log.Warn("cannot remove cgroup of failed restore", "instance", spec.ID, "err", rerr)
		}
		return nil, err
	}
	root, err := m.restoreRoot(spec)
	if err != nil {
		return fail(err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(root)
		}
	}()
	env := RestoreEnv{
		Root:       root,
		ExecPrefix: m.execPrefix(cg.procsFiles()),
		Mounts:     m.ExternalMounts(spec),
	}

	// exec.Cmd uses argv[0] as the path: the first element is the binary,
	// the second its argv[0] (see cgexecMain).
	pid, err := restore(ctx, env)
	if err != nil {
		return fail(err)
	}
	if !spec.HostNetwork {
		// A namespace restored empty (snapshot.RestoreSpec.EmptyNetwork)
		// has loopback down; for one restored whole this is a no-op.
		if err = loopbackUpIn(pid); err != nil {
			_ = unix.Kill(pid, unix.SIGKILL)
			return fail(err)
		}
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		err = fmt.Errorf("restored pid %d: %w", pid, err)
		return fail(err)
	}
	s := &Sandbox{
		id:       spec.ID,
		m:        m,
		proc:     proc,
		waitProc: waitStatus(proc.Wait),
		cg:       cg,
		rootDir:  root,
		done:     make(chan struct{}),
	}
	go s.wait()
	m.log.Debug("sandbox restored", "instance", spec.ID, "pid", pid, "uid", spec.UID)
	return s, nil
}

// restoreRootsDir, under the state dir, holds restoreRoot's directories.
const restoreRootsDir = "roots"

// restoreRoot builds the directory a restored instance's root is bound
// from. CRIU restores the contents of the instance's tmpfs mounts, but
// takes the root mount from a directory: it must hold the mount points
// (and the /bin → usr/bin style links) that buildRoot puts in the root
// tmpfs. It is read-only inside the instance and removed with it.
func (m *Manager) restoreRoot(spec Spec) (string, error) {
	root := filepath.Join(m.cfg.StateDir, restoreRootsDir, spec.ID)
	if err := os.RemoveAll(root); err != nil {
		return "", fmt.Errorf("restore root: %w", err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", fmt.Errorf("restore root: %w", err)
	}
	if _, err := makeMountPoints(root); err != nil {
		return "", fmt.Errorf("restore root: %w", err)
	}
	for _, b := range spec.Binds {
		p := filepath.Join(root, b.Target)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", fmt.Errorf("restore root: %w", err)
		}
		fi, err := os.Stat(b.Source)
		if err != nil {
			return "", fmt.Errorf("restore root: bind source: %w", err)
		}
		if fi.IsDir() {
			err = os.MkdirAll(p, 0o755)
		} else {
			err = os.WriteFile(p, nil, 0o644)
		}
		if err != nil {
			return "", fmt.Errorf("restore root: %w", err)
		}
	}
	return root, nil
}

// InitVersion changes whenever what a Manager hands its init (the init
// config, the cgexec arguments) changes, so that a worker never uses a
// torpor-init from another build.
const InitVersion = "torpor-init/2"

// FindInit returns the torpor-init binary installed beside exe (the
// worker's own executable) when it answers with this build's InitVersion,
// or "" (then the Manager re-executes the worker's own binary, which is
// slower to start but always matches).
func FindInit(ctx context.Context, exe string) string {
	p := filepath.Join(filepath.Dir(exe), "torpor-init")
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, p, "--init-version").Output()
	if err != nil || strings.TrimSpace(string(out)) != InitVersion {
		return ""
	}
	return p
}

// cgexecArg0 marks a re-execution of the worker's binary that joins the
// cgroups named on its command line and execs the rest (the snapshot
// engine), so that the engine and everything it creates start inside them.
const cgexecArg0 = "torpor-sandbox-cgexec"

// execPrefix runs a program (the snapshot engine) through cgexec: inside
// the cgroups whose cgroup.procs files are given, and with a private mount
// namespace whose /run is a tmpfs directory that outlives the program.
// CRIU caches what it learns about the kernel in /run/criu.kdat, but only
// on a tmpfs (it must not survive a reboot); where /run is not one (as on
// this project's CI machines) every CRIU run would probe the kernel again,
// ~30 ms each.
func (m *Manager) execPrefix(procs []string) []string {
	p := []string{m.cfg.InitPath, cgexecArg0}
	if m.criuRun != "" && os.MkdirAll(m.criuRun, 0o700) == nil {
		p = append(p, "--run", m.criuRun)
	}
	return append(append(p, procs...), "--")
}

// ExecPrefix is execPrefix without cgroups: for a checkpoint, which runs
// the engine on the worker's own account.
func (m *Manager) ExecPrefix() []string { return m.execPrefix(nil) }

// criuRunDir picks the tmpfs directory execPrefix binds over /run, or ""
// when there is no tmpfs to use.
func criuRunDir(stateDir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return ""
	}
	sum := sha256.Sum256([]byte(stateDir))
	dir := "/dev/shm/torpor-run-" + hex.EncodeToString(sum[:6])
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return ""
	}
	return dir
}

// cgexecMain is that re-execution: [--run DIR] CGROUP.PROCS... -- PROGRAM ARGS...
func cgexecMain() {
	runtime.LockOSThread() // the mount namespace below belongs to this thread, which execs
	args := os.Args[1:]
	fail := func(code int, format string, a ...any) {
		fmt.Fprintf(os.Stderr, cgexecArg0+": "+format+"\n", a...)
		os.Exit(code)
	}
	run := ""
	if len(args) >= 2 && args[0] == "--run" {
		run, args = args[1], args[2:]
	}
	sep := slices.Index(args, "--")
	if sep < 0 || sep == len(args)-1 {
		fail(2, "usage: %s [--run DIR] CGROUP.PROCS... -- PROGRAM [ARGS...]", cgexecArg0)
	}
	for _, p := range args[:sep] {
		if err := writeCgroupFile(p, "0"); err != nil {
			fail(126, "join cgroup: %v", err)
		}
	}
	if run != "" {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			fail(126, "unshare mount namespace: %v", err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			fail(126, "make mounts private: %v", err)
		}
		if err := unix.Mount(run, "/run", "", unix.MS_BIND, ""); err != nil {
			fail(126, "bind %s on /run: %v", run, err)
		}
	}
	argv := args[sep+1:]
	err := syscall.Exec(argv[0], argv, os.Environ())
	if errors.Is(err, unix.ENOENT) {
		fail(127, "%s not found", argv[0])
	}
	fail(126, "exec %s: %v", argv[0], err)
}
