package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// initArg0 is the argv[0] under which the worker binary runs as the
// in-sandbox init.
const initArg0 = "torpor-sandbox-init"

// initExitCode is the init's exit code when it fails before exec (the
// shell's "found but cannot execute").
const initExitCode = 126

// initConfig is what Start sends the init over its config pipe.
type initConfig struct {
	Root        string   // host dir the new root tmpfs is mounted on
	DevDir      string   // host dir of the /dev skeleton
	CgroupProcs []string // cgroup.procs files to join (by writing "0")
	Hostname    string
	UID, GID    int
	Binds       []Bind
	Argv        []string
	Env         []string
	Dir         string
	NumExtra    int // ExtraFiles already sit at fd 3 .. 3+NumExtra-1
	TmpMB       int
	NProc       int
	NoFile      int
	OwnNetwork  bool // in a new network namespace: bring its loopback up
	Privileged  bool // a runtime template: stay root, keep capabilities, no seccomp (Spec.Template)
}

// initFailure is what the init writes to its status pipe when it fails.
type initFailure struct {
	Step string `json:"step"`
	Err  string `json:"error"`
}

// stepError is an init failure at a named step.
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.step + ": " + e.err.Error() }

func step(name string, err error) error {
	if err == nil {
		return nil
	}
	return &stepError{step: name, err: err}
}

// IsInit reports whether this process was started by a Manager as the
// in-sandbox init. The worker's main must call it (and InitMain) before
// doing anything else.
func IsInit() bool {
	return len(os.Args) > 0 && (os.Args[0] == initArg0 || os.Args[0] == cgexecArg0)
}

// InitMain is the in-sandbox init. It runs as root inside the new
// namespaces, builds the sandbox as its config says, drops all privileges,
// installs the seccomp filter and execs the instance's program. It never
// returns: on failure it prints "torpor sandbox init: <step>: <error>" to
// stderr, reports the same to the Manager, and exits 126.
func InitMain() {
	if os.Args[0] == cgexecArg0 {
		cgexecMain()
	}
	// Thread-scoped state (capability bounding set, no_new_privs,
	// parent-death signal, the seccomp filter) must be set on the thread
	// that execs.
	runtime.LockOSThread()
	statusFD := -1
	err := runInit(&statusFD)
	var se *stepError
	if !errors.As(err, &se) {
		se = &stepError{step: "init", err: err}
	}
	fmt.Fprintf(os.Stderr, "torpor sandbox init: %s\n", se)
	if statusFD >= 0 {
		b, _ := json.Marshal(initFailure{Step: se.step, Err: se.err.Error()})
		_, _ = unix.Write(statusFD, b)
	}
	os.Exit(initExitCode)
}

// runInit does the init's work; it returns only on failure.
func runInit(statusFD *int) error {
	if len(os.Args) != 3 {
		return step("arguments", fmt.Errorf("want %s CONFIG-FD STATUS-FD, got %q", initArg0, os.Args))
	}
	cfgFD, err1 := strconv.Atoi(os.Args[1])
	sFD, err2 := strconv.Atoi(os.Args[2])
	if err := errors.Join(err1, err2); err != nil {
		return step("arguments", err)
	}
	*statusFD = sFD

	f := os.NewFile(uintptr(cfgFD), "config")
	data, err := io.ReadAll(f)
	f.Close()
	if err != nil {
		return step("read config", err)
	}
	var cfg initConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return step("read config", err)
	}

	// pids.max is not enforced on joining, so the runtime's threads
	// cannot make this fail.
	for _, p := range cfg.CgroupProcs {
		if err := writeCgroupFile(p, "0"); err != nil {
			return step("join cgroup", err)
		}
	}
	unix.Umask(0)
	if err := buildRoot(&cfg); err != nil {
		return err
	}
	if err := reopenNullStdio(); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return step("sethostname", err)
	}
	if cfg.OwnNetwork {
		if err := loopbackUp(); err != nil {
			return step("loopback up", err)
		}
	}
	if err := setRlimits(&cfg); err != nil {
		return step("setrlimit", err)
	}
	unix.Umask(0o022)
	if cfg.Privileged {
		if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
			return step("pdeathsig", err)
		}
	} else if err := dropPrivileges(cfg.UID, cfg.GID); err != nil {
		return err
	}
	if err := unix.Chdir(cfg.Dir); err != nil {
		return step("chdir", fmt.Errorf("%s: %w", cfg.Dir, err))
	}
	// Everything from the first fd after the extra files up (the status
	// pipe, Go's own descriptors, anything inherited by accident) closes on
	// exec; a successful exec thereby tells the Manager it is done.
	if err := unix.CloseRange(uint(3+cfg.NumExtra), ^uint(0), unix.CLOSE_RANGE_CLOEXEC); err != nil {
		return step("close_range", err)
	}
	// Last before exec (it needs no_new_privs, set by dropPrivileges), so
	// that the filter constrains only the program, never the init's own
	// mounts. See installSeccomp for why this thread alone is enough.
	if !cfg.Privileged {
		if err := installSeccomp(); err != nil {
			return step("seccomp", err)
		}
	}
	err = syscall.Exec(cfg.Argv[0], cfg.Argv, cfg.Env)
	return step("exec", fmt.Errorf("%s: %w", cfg.Argv[0], err))
}

// reopenNullStdio replaces each of fds 0-2 that is the host's /dev/null
// with the sandbox's own: a file of the host's mount namespace held open
// inside the sandbox would make the instance impossible to checkpoint (CRIU
// can only dump files reachable from the dumped mount tree).
func reopenNullStdio() error {
	var null unix.Stat_t
	if err := unix.Stat("/dev/null", &null); err != nil {
		return step("stat /dev/null", err)
	}
	for fd := 0; fd <= 2; fd++ {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != null.Rdev {
			continue
		}
		nfd, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return step("open /dev/null", err)
		}
		err = unix.Dup3(nfd, fd, 0)
		unix.Close(nfd)
		if err != nil {
			return step("reopen /dev/null", err)
		}
	}
	return nil
}

// setRlimits applies the per-process limits. syscall.Setrlimit (not
// unix.Setrlimit) so that Go does not restore its saved RLIMIT_NOFILE on exec.
func setRlimits(cfg *initConfig) error {
	set := func(res int, v uint64) error {
		if err := syscall.Setrlimit(res, &syscall.Rlimit{Cur: v, Max: v}); err != nil {
			return fmt.Errorf("resource %d = %d: %w", res, v, err)
		}
		return nil
	}
	if err := set(unix.RLIMIT_CORE, 0); err != nil {
		return err
	}
	if err := set(unix.RLIMIT_NOFILE, uint64(cfg.NoFile)); err != nil {
		return err
	}
	if cfg.NProc > 0 {
		// Counts every process of the uid on the host (see Limits.NProc).
		if err := set(unix.RLIMIT_NPROC, uint64(cfg.NProc)); err != nil {
			return err
		}
	}
	return nil
}

// dropPrivileges empties the capability bounding and ambient sets, switches
// to uid/gid with no supplementary groups, and sets no_new_privs and the
// parent-death signal (which the uid change clears).
//
// All of it is done to the calling thread only, with raw system calls, not
// with syscall.Setuid and friends, which change every thread of the process
// (one signal round trip per call): the thread is locked (InitMain) and is
// the one that execs, and exec keeps only the calling thread's credentials
// and kills the other threads, which run nothing but the Go runtime.
func dropPrivileges(uid, gid int) error {
	for c := 0; ; c++ {
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if errors.Is(err, unix.EINVAL) {
			break // past the kernel's last capability
		}
		if err != nil {
			return step("drop capabilities", fmt.Errorf("capability %d: %w", c, err))
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return step("drop capabilities", err)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
		return step("setgroups", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
		return step("setgid", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
		return step("setuid", e)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return step("no_new_privs", err)
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return step("pdeathsig", err)
	}
	return nil
}

// loopbackUp brings up lo, the only interface of a new network namespace.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}
