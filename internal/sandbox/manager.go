package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Config configures a Manager.
type Config struct {
	// StateDir is the per-worker directory, e.g. $TORPOR_HOME/sandbox,
	// created 0700. It holds the directory "rootfs" on which every
	// sandbox mounts its root, each in its own mount namespace (so the host
	// sees only an empty directory, and no per-instance mkdir is needed).
	StateDir string
	// CgroupName names the parent cgroup of the instances. A relative
	// name is taken below the worker's own cgroup (so a worker started at
	// the root cgroup gets e.g. /sys/fs/cgroup/memory/<name>/<id>, and one
	// started inside a service or container cgroup stays within its
	// limits); an absolute name is taken from the hierarchy root.
	//
	// NewManager kills and removes whatever it finds below it, taking it
	// for the leftovers of a crashed run, so every worker on a host needs
	// its own. The default, "torpor/<hash of StateDir>", gives one per
	// StateDir: workers with different homes (tests, several `torpor up`)
	// leave each other alone, and a restarted worker finds its own
	// leftovers.
	//
	// On cgroup v2 a relative
	// name needs the controllers delegated to the worker's cgroup; if the
	// worker is alone there, NewManager moves it into the leaf
	// "<first component of CgroupName>-manager" so that its cgroup can
	// delegate ("no internal processes").
	CgroupName string
	// InitPath is the binary exec'd as the in-sandbox init; default
	// "/proc/self/exe". Its main must start with
	// `if sandbox.IsInit() { sandbox.InitMain() }`.
	InitPath string
	// TotalMemoryMB, when set, caps the memory of all of this worker's
	// sandboxes together (the limit of their parent cgroup): a node's
	// allocatable memory. MemoryHeadroom reports what is left of it.
	TotalMemoryMB int
	// KeepCgroupOptions leaves the host's cgroup mount options as they
	// are; by default NewManager sets favordynmods on the cgroup2 mount,
	// which makes moving a process between cgroups ~100x faster (see
	// favorDynMods).
	KeepCgroupOptions bool
}

// Manager starts and tracks the sandboxes of one worker. It is safe for
// concurrent use.
type Manager struct {
	cfg Config
	log *slog.Logger
	cg  *cgroupTree

	defaultName bool   // CgroupName is defaultCgroupName's
	criuRun     string // tmpfs directory bound over /run for the snapshot engine (see execPrefix)
	pool        *cgroupPool

	mu     sync.Mutex
	live   map[string]*Sandbox // nil value: Start in progress
	closed bool
}

// defaultCgroupName is "torpor/" and a hash of the absolute stateDir.
func defaultCgroupName(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return "torpor/" + hex.EncodeToString(sum[:6])
}

// NewManager checks that it runs as root, detects the cgroup version,
// creates the parent cgroups and the state dir, and kills and removes any
// instance cgroups and state left by a previous run of this worker.
func NewManager(ctx context.Context, cfg Config, log *slog.Logger) (*Manager, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("sandbox manager: must run as root (euid is %d): %w", os.Geteuid(), errdefs.ErrInvalid)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.StateDir == "" {
		return nil, fmt.Errorf("sandbox manager: StateDir is not set: %w", errdefs.ErrInvalid)
	}
	var err error
	if cfg.StateDir, err = filepath.Abs(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("sandbox manager: state dir: %w", err)
	}
	defaultName := cfg.CgroupName == ""
	if defaultName {
		cfg.CgroupName = defaultCgroupName(cfg.StateDir)
	}
	if filepath.Clean(cfg.CgroupName) != cfg.CgroupName || cfg.CgroupName == "/" || cfg.CgroupName == "." {
		return nil, fmt.Errorf("sandbox manager: CgroupName %q must be a clean path other than / and .: %w", cfg.CgroupName, errdefs.ErrInvalid)
	}
	if cfg.InitPath == "" {
		cfg.InitPath = "/proc/self/exe"
	}

	mf, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("sandbox manager: %w", err)
	}
	mounts, err := parseMountinfo(mf)
	mf.Close()
	if err != nil {
		return nil, fmt.Errorf("sandbox manager: %w", err)
	}
	layout, err := detectCgroups(mounts)
	if err != nil {
		return nil, fmt.Errorf("sandbox manager: %w", err)
	}
	cf, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("sandbox manager: %w", err)
	}
	self, err := parseProcCgroup(cf)
	cf.Close()
	if err != nil {
		return nil, fmt.Errorf("sandbox manager: %w", err)
	}
	if !cfg.KeepCgroupOptions {
		if on, err := favorDynMods(mounts); err != nil {
			log.Warn("cannot set favordynmods on the cgroup2 mount: moving new templates and instances into their cgroups may wait for RCU grace periods (milliseconds each)", "err", err)
		} else if on {
			log.Debug("cgroup2 favordynmods is on")
		}
	}
	tree, err := newCgroupTree(layout, self, cfg.CgroupName)
	if err != nil {
		return nil, fmt.Errorf("sandbox manager: %w", err)
	}
	if err := tree.setup(); err != nil {
		return nil, fmt.Errorf("sandbox manager: %w", err)
	}
	if err := tree.setParentMemory(cfg.TotalMemoryMB); err != nil {
		return nil, fmt.Errorf("sandbox manager: %w", err)
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox manager: create state dir: %w", err)
	}
	if err := os.Chmod(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("sandbox manager: state dir: %w", err)
	}
	if err := os.Mkdir(filepath.Join(cfg.StateDir, rootfsDir), 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("sandbox manager: create root mount point: %w", err)
	}
	if err := makeDevSkeleton(filepath.Join(cfg.StateDir, devSkeletonDir)); err != nil {
		return nil, fmt.Errorf("sandbox manager: /dev skeleton: %w", err)
	}
	if tree.movedTo != "" {
		log.Info("moved the worker to a leaf cgroup so that its own can delegate to sandboxes", "cgroup", tree.movedTo)
	}
	m := &Manager{cfg: cfg, log: log, cg: tree, live: map[string]*Sandbox{}, defaultName: defaultName, criuRun: criuRunDir(cfg.StateDir),
		pool: &cgroupPool{t: tree, size: cgroupPoolSize}}
	if err := m.cleanStale(ctx); err != nil {
		return nil, fmt.Errorf("sandbox manager: clean up after previous run: %w", err)
	}
	// Roots of restored sandboxes of a previous run (whose processes
	// cleanStale just killed).
	if err := os.RemoveAll(filepath.Join(cfg.StateDir, restoreRootsDir)); err != nil {
		return nil, fmt.Errorf("sandbox manager: clean up after previous run: %w", err)
	}
	log.Info("sandbox manager ready", "cgroup_version", tree.version, "cgroup_parents", tree.parents, "state_dir", cfg.StateDir)
	return m, nil
}

// CgroupVersion returns 1 or 2.
func (m *Manager) CgroupVersion() int { return m.cg.version }

// cleanStale kills and removes the instance cgroups left behind by a
// previous run (its instances may still be running if it crashed).
func (m *Manager) cleanStale(ctx context.Context) error {
	names, err := m.cg.children()
	if err != nil {
		return err
	}
	for _, id := range names {
		c := m.cg.instance(id)
		_ = c.killAll()
		if err := c.remove(ctx); err != nil {
			return fmt.Errorf("stale instance %s: %w", id, err)
		}
		m.log.Warn("removed stale sandbox cgroup", "instance", id)
	}
	return nil
}

// Start creates the instance's cgroup and starts its init, and returns once
// the init has exec'd spec.Argv (or failed; then the error carries the
// init's message, as an *InitError). Cancelling ctx aborts a start in
// progress; it does not affect the sandbox once Start has returned.
func (m *Manager) Start(ctx context.Context, spec Spec) (*Sandbox, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start sandbox %s: %w", spec.ID, err)
	}
	if err := spec.normalize(); err != nil {
		return nil, err
	}
	return m.track("start", spec.ID, func() (*Sandbox, error) { return m.start(ctx, spec) })
}

// track runs create for the sandbox id (Start or Restore), keeping id
// reserved in the live set while it runs and recording the result.
func (m *Manager) track(op, id string, create func() (*Sandbox, error)) (*Sandbox, error) {
	m.mu.Lock()
	switch _, dup := m.live[id]; {
	case m.closed:
		m.mu.Unlock()
		return nil, fmt.Errorf("%s sandbox %s: manager is closed: %w", op, id, errdefs.ErrUnavailable)
	case dup:
		m.mu.Unlock()
		return nil, fmt.Errorf("%s sandbox %s: an instance with this id exists: %w", op, id, errdefs.ErrConflict)
	}
	m.live[id] = nil
	m.mu.Unlock()

	s, err := create()
	m.mu.Lock()
	if err != nil {
		delete(m.live, id)
	} else {
		m.live[id] = s
	}
	m.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("%s sandbox %s: %w", op, id, err)
	}
	return s, nil
}

func (m *Manager) start(ctx context.Context, spec Spec) (*Sandbox, error) {
	var cg *instanceCgroup // created once the init runs (in parallel with it)
	cleanup := func() {
		if cg != nil {
			// The init was reaped, so this is one rmdir per directory.
			if err := cg.remove(context.WithoutCancel(ctx)); err != nil {
				m.log.Warn("cannot remove cgroup of failed sandbox", "instance", spec.ID, "err", err)
			}
		}
	}
	data, err := json.Marshal(initConfig{
		Root:        filepath.Join(m.cfg.StateDir, rootfsDir),
		DevDir:      filepath.Join(m.cfg.StateDir, devSkeletonDir),
		CgroupProcs: m.cg.instance(spec.ID).procsFiles(),
		Hostname:    spec.Hostname,
		UID:         spec.UID,
		GID:         spec.GID,
		Binds:       spec.Binds,
		Argv:        spec.Argv,
		Env:         spec.Env,
		Dir:         spec.Dir,
		NumExtra:    len(spec.ExtraFiles),
		TmpMB:       spec.Limits.TmpMB,
		NProc:       spec.Limits.NProc,
		NoFile:      spec.Limits.NoFile,
		OwnNetwork:  !spec.HostNetwork,
		Privileged:  spec.Template != nil,
	})
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("encode init config: %w", err)
	}
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("config pipe: %w", err)
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		cfgR.Close()
		cfgW.Close()
		cleanup()
		return nil, fmt.Errorf("status pipe: %w", err)
	}
	defer statusR.Close()
	cfgFD := 3 + len(spec.ExtraFiles)
	cmd := &exec.Cmd{
		Path: m.cfg.InitPath,
		Args: []string{initArg0, strconv.Itoa(cfgFD), strconv.Itoa(cfgFD + 1)},
		// The init's own environment; the program gets spec.Env. One P and
		// no GC: the init is short-lived and every thread slows its exec.
		Env:        []string{"GOMAXPROCS=1", "GOGC=off"},
		ExtraFiles: append(slices.Clip(spec.ExtraFiles), cfgR, statusW),
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: cloneFlags(spec.HostNetwork),
			// A user namespace owned by the worker (see userMappings).
			UidMappings:                userMappings(spec.UID, spec.Template),
			GidMappings:                userMappings(spec.GID, spec.Template),
			GidMappingsEnableSetgroups: true,
			// Its own session: no controlling terminal of the worker, and
			// CRIU can only dump a tree whose session leader is inside it.
			Setsid: true,
			// Until the init changes uid (which clears it and so sets it again).
			Pdeathsig: syscall.SIGKILL,
		},
	}
	if spec.Stdout != nil {
		cmd.Stdout = spec.Stdout
	}
	if spec.Stderr != nil {
		cmd.Stderr = spec.Stderr
	}
	err = cmd.Start()
	cfgR.Close()
	statusW.Close()
	if err != nil {
		cfgW.Close()
		cleanup()
		return nil, fmt.Errorf("start init %s: %w", m.cfg.InitPath, err)
	}
	stop := context.AfterFunc(ctx, func() { _ = cmd.Process.Kill() })
	abort := func() {
		stop()
		cfgW.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		cleanup()
	}
	// Create the cgroup while the init's Go runtime starts up; the init
	// joins it as soon as it has read its config, before it does anything
	// worth accounting. (Moving it from here instead, while its runtime
	// spawns threads, measured 1.5-2 ms slower per start.)
	if cg, err = m.cg.create(spec.ID, spec.Limits); err != nil {
		abort()
		return nil, err
	}
	// The init reads all of it at once; if it died, this fails with EPIPE and
	// the status pipe says why.
	_, werr := cfgW.Write(data)
	cfgW.Close()
	// EOF with no data: the exec closed the pipe (close-on-exec).
	status, rerr := io.ReadAll(statusR)
	stopped := !stop()
	if len(status) > 0 || stopped || rerr != nil || werr != nil {
		abort()
		switch {
		case len(status) > 0:
			return nil, newInitError(status)
		case stopped:
			return nil, fmt.Errorf("init aborted: %w", ctx.Err())
		case rerr != nil:
			return nil, fmt.Errorf("read init status: %w", rerr)
		default:
			return nil, fmt.Errorf("init died before reading its config (%s): %w", cmd.ProcessState, werr)
		}
	}

	s := &Sandbox{
		id:   spec.ID,
		m:    m,
		proc: cmd.Process,
		waitProc: waitStatus(func() (*os.ProcessState, error) {
			err := cmd.Wait()
			return cmd.ProcessState, err
		}),
		cg:   cg,
		done: make(chan struct{}),
	}
	go s.wait()
	m.log.Debug("sandbox started", "instance", spec.ID, "pid", cmd.Process.Pid, "uid", spec.UID)
	return s, nil
}

// forget drops a destroyed sandbox from the live set.
func (m *Manager) forget(id string) {
	m.mu.Lock()
	delete(m.live, id)
	m.mu.Unlock()
}

// Close destroys every live sandbox and removes the parent cgroups. Starts
// after Close fail with errdefs.ErrUnavailable.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	var live []*Sandbox
	for _, s := range m.live {
		if s != nil {
			live = append(live, s)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, s := range live {
		if err := s.Destroy(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	m.pool.close(ctx)
	if len(errs) == 0 {
		m.mu.Lock()
		pending := len(m.live)
		m.mu.Unlock()
		if pending == 0 {
			errs = append(errs, m.cg.removeParents(m.defaultName))
		}
	}
	if m.criuRun != "" {
		errs = append(errs, os.RemoveAll(m.criuRun))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("close sandbox manager: %w", err)
	}
	return nil
}

// InitError is a failure of the in-sandbox init before it could exec the
// instance's program. Spec problems (a missing program, working directory or
// bind source) match errdefs.ErrInvalid; anything else errdefs.ErrUnavailable.
type InitError struct {
	Step    string // e.g. "exec", "chdir", "bind /var/task", "mount /proc"
	Message string // what the step failed with
}

func newInitError(status []byte) *InitError {
	var f initFailure
	if err := json.Unmarshal(status, &f); err != nil || f.Step == "" {
		return &InitError{Step: "init", Message: string(status)}
	}
	return &InitError{Step: f.Step, Message: f.Err}
}

// Error returns the init's own message, "torpor sandbox init: <step>: <error>".
func (e *InitError) Error() string { return "torpor sandbox init: " + e.Step + ": " + e.Message }

// Is classifies the failure for errors.Is.
func (e *InitError) Is(target error) bool {
	switch target {
	case errdefs.ErrInvalid:
		return e.isSpecProblem()
	case errdefs.ErrUnavailable:
		return !e.isSpecProblem()
	}
	return false
}

func (e *InitError) isSpecProblem() bool {
	return e.Step == "exec" || e.Step == "chdir" || strings.HasPrefix(e.Step, "bind ")
}

// userMappings maps root and the instance's own id, each to itself, in
// the instance's user namespace.
//
// The namespace is there for checkpoints: it is owned by the worker's
// root, which therefore holds every capability over the instance — among
// them CAP_SYS_RESOURCE, which CRIU needs to read another user's rlimits
// and which hosts (this project's CI among them) may withhold from root
// in the initial namespace. Identity mappings keep file ownership the
// same inside and out. Mapping root lets the init, before it drops to the
// instance's id, read root-only directories and join root-owned cgroups
// exactly as without the namespace; the program then runs as id, with no
// capabilities, no_new_privs and nosuid mounts, so it can reach uid 0 of
// the namespace only through the same kind of kernel bug that would give
// it host root without one — and capabilities in the namespace are
// narrower than host root's (no modules, no host network, no devices).
//
// A runtime template's namespace maps a whole range of ids instead: those
// its function templates switch to (see Spec.Template).
func userMappings(id int, t *TemplateSpec) []syscall.SysProcIDMap {
	if t != nil {
		return []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1},
			{ContainerID: t.IDs.First, HostID: t.IDs.First, Size: t.IDs.Count}}
	}
	return []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: id, HostID: id, Size: 1}}
}

// cloneFlags are the namespaces a new instance gets.
func cloneFlags(hostNetwork bool) uintptr {
	f := uintptr(syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS)
	if !hostNetwork {
		f |= syscall.CLONE_NEWNET
	}
	return f
}
