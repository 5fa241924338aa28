package sandbox

import (
	"fmt"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Defaults and bounds applied to Limits.
const (
	// DefaultTmpMB is the size of /tmp when Limits.TmpMB is 0 (a tmpfs of
	// size 0 would be unlimited).
	DefaultTmpMB = 64
	// DefaultNoFile is RLIMIT_NOFILE when Limits.NoFile is 0.
	DefaultNoFile = 1024
	// MinMemoryMB is the smallest non-zero memory limit: the in-sandbox
	// init (a Go program) must fit before it execs the instance's program,
	// or it is OOM-killed before it can report anything.
	MinMemoryMB = 16
	// MinPids is the smallest non-zero pids limit: the init's Go runtime
	// runs a few threads, which count as pids, until it execs.
	MinPids = 8
)

// validID reports whether id matches ^[a-z0-9][a-z0-9-]{0,63}$. It is not a
// package-level regexp because package initialisation runs again in every
// sandbox init (the worker binary), on the cold-start path.
func validID(id string) bool {
	if len(id) == 0 || len(id) > 64 || id[0] == '-' {
		return false
	}
	for _, c := range []byte(id) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// Bind makes a host path visible inside the sandbox.
type Bind struct {
	Source   string // absolute host path (file or directory)
	Target   string // absolute path inside the sandbox; missing parents are created 0755
	Writable bool   // read-only unless set
}

// Limits are the resource limits of one instance. A zero field means "no
// limit from torpor" (the parent cgroup still applies) except where noted.
type Limits struct {
	MemoryMB  int // memory (and memory+swap) limit; 0 or >= MinMemoryMB
	CPUShares int // relative CPU weight in cgroup v1 units (1024 = default), converted for v2 cpu.weight
	Pids      int // max tasks (processes and threads) in the instance's cgroup; 0 or >= MinPids
	TmpMB     int // size of the /tmp tmpfs; 0 means DefaultTmpMB
	NoFile    int // RLIMIT_NOFILE; 0 means DefaultNoFile
	// NProc is RLIMIT_NPROC, a second line of defence behind Pids; 0 leaves
	// it unset. The kernel counts it per uid across the whole host, that
	// is, across every instance of the function: set it to a bound for all
	// of them (e.g. Pids times the function's instance limit), never to
	// Pids, or the (NProc+1)th instance fails to exec with EAGAIN.
	NProc int
}

// Spec describes one instance to start.
type Spec struct {
	ID       string // instance id, unique per worker ([a-z0-9-], at most 64); names the cgroup and state dir
	UID, GID int    // non-root identity the program runs as (0 is rejected)
	Hostname string // UTS hostname inside the sandbox; defaults to "torpor"
	// Binds are mounted after the system directories, in order. The
	// worker passes the code dir -> /var/task, the agent dir -> /opt/torpor
	// and any runtime prefix that is not under /usr.
	Binds []Bind
	Argv  []string // argv[0] is an absolute path inside the sandbox
	Env   []string // the program's whole environment
	Dir   string   // working directory inside the sandbox; defaults to "/"
	// ExtraFiles appear in the program as fd 3, 4, ...; no other
	// descriptor beyond 0-2 is inherited.
	ExtraFiles     []*os.File
	Stdout, Stderr *os.File // nil means /dev/null
	Limits         Limits
	// HostNetwork shares the host's network namespace. By default an
	// instance gets its own, with only a loopback interface: it cannot
	// reach the gateway, NATS or any other instance's sockets, on loopback
	// or otherwise.
	HostNetwork bool
	// Template, set only for a runtime template (a trusted fork server that
	// builds function sandboxes from inside, see internal/template), keeps
	// the program root with every capability inside the sandbox's user
	// namespace — no uid change, no seccomp filter — and maps the ids of
	// Template.IDs on top of root, for the function templates it forks to
	// switch to. Never set it for a program that runs tenant code. UID and
	// GID are ignored.
	Template *TemplateSpec
}

// TemplateSpec is what a runtime template's sandbox adds (Spec.Template).
type TemplateSpec struct {
	IDs IDRange // uids and gids (the same numbers) its function templates may take
}

// IDRange is the ids First .. First+Count-1.
type IDRange struct{ First, Count int }

// ExitStatus is how an instance's init (pid 1 in its PID namespace) ended.
type ExitStatus struct {
	Code      int            // exit code, or -1 when killed by a signal
	Signal    syscall.Signal // the signal that killed it, or 0
	OOMKilled bool           // the kernel OOM killer killed a process of the instance's cgroup
}

// Stats are an instance's resource counters, read from its cgroup.
type Stats struct {
	MemoryBytes    uint64 // current memory usage (including page cache and tmpfs)
	MaxMemoryBytes uint64 // peak memory usage since the cgroup was created
}

// normalize fills the defaults of s and validates it. Errors wrap
// errdefs.ErrInvalid.
func (s *Spec) normalize() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("sandbox spec %q: %s: %w", s.ID, fmt.Sprintf(format, a...), errdefs.ErrInvalid)
	}
	if !validID(s.ID) {
		return bad("id must be 1-64 characters from [a-z0-9-], starting with a letter or digit")
	}
	if t := s.Template; t != nil {
		if t.IDs.First <= 0 || t.IDs.Count <= 0 || t.IDs.First+t.IDs.Count > 1<<31 {
			return bad("template id range %+v: want First > 0, Count > 0", t.IDs)
		}
		s.UID, s.GID = 0, 0
	} else if s.UID <= 0 || s.GID <= 0 {
		return bad("uid %d / gid %d: both must be non-root (> 0)", s.UID, s.GID)
	}
	if s.Hostname == "" {
		s.Hostname = "torpor"
	}
	if len(s.Hostname) > 64 || strings.ContainsAny(s.Hostname, "\x00/ ") {
		return bad("hostname %q: use at most 64 characters without spaces or slashes", s.Hostname)
	}
	if len(s.Argv) == 0 || !path.IsAbs(s.Argv[0]) {
		return bad("argv[0] must be an absolute path inside the sandbox, got %q", s.Argv)
	}
	if s.Dir == "" {
		s.Dir = "/"
	}
	if !path.IsAbs(s.Dir) {
		return bad("dir %q must be absolute", s.Dir)
	}
	for _, b := range s.Binds {
		if err := validateBind(b); err != nil {
			return bad("%v", err)
		}
	}
	for i, f := range s.ExtraFiles {
		if f == nil {
			return bad("extra file %d (fd %d) is nil", i, 3+i)
		}
	}
	l := &s.Limits
	if l.MemoryMB < 0 || l.CPUShares < 0 || l.Pids < 0 || l.TmpMB < 0 || l.NoFile < 0 || l.NProc < 0 {
		return bad("negative limit in %+v", *l)
	}
	if l.MemoryMB != 0 && l.MemoryMB < MinMemoryMB {
		return bad("memory limit %d MB is below the minimum of %d MB", l.MemoryMB, MinMemoryMB)
	}
	if l.Pids != 0 && l.Pids < MinPids {
		return bad("pids limit %d is below the minimum of %d", l.Pids, MinPids)
	}
	if l.CPUShares != 0 && (l.CPUShares < 2 || l.CPUShares > 262144) {
		return bad("cpu shares %d out of range: use 2-262144 (1024 = default)", l.CPUShares)
	}
	if l.TmpMB == 0 {
		l.TmpMB = DefaultTmpMB
	}
	if l.NoFile == 0 {
		l.NoFile = DefaultNoFile
	}
	return nil
}

// validateBind checks that b's paths are absolute and clean and that the
// target does not shadow what the sandbox itself mounts.
func validateBind(b Bind) error {
	if !path.IsAbs(b.Source) {
		return fmt.Errorf("bind source %q must be absolute", b.Source)
	}
	if !path.IsAbs(b.Target) || path.Clean(b.Target) != b.Target {
		return fmt.Errorf("bind target %q must be an absolute, clean path", b.Target)
	}
	for _, p := range []string{"/", "/proc", "/dev", "/tmp", oldRootDir} {
		if b.Target == p || (p != "/" && strings.HasPrefix(b.Target, p+"/")) {
			return fmt.Errorf("bind target %q would hide the sandbox's own %s", b.Target, p)
		}
	}
	return nil
}
