//go:build amd64

package sandbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// seccompData is the kernel's struct seccomp_data, the filter's input.
type seccompData struct {
	nr   uint32
	arch uint32
	ip   uint64
	args [6]uint64
}

func (d seccompData) encode() []byte {
	b := make([]byte, seccompDataSize)
	binary.LittleEndian.PutUint32(b[seccompDataNr:], d.nr)
	binary.LittleEndian.PutUint32(b[seccompDataArch:], d.arch)
	binary.LittleEndian.PutUint64(b[8:], d.ip)
	for i, a := range d.args {
		binary.LittleEndian.PutUint64(b[seccompDataArgsLow+8*i:], a)
	}
	return b
}

// evalSeccomp runs prog on d as the kernel would, for the instructions the
// filter uses (anything else is an error). constant reports whether the
// result depended on nr and arch only: the kernel then caches an ALLOW for
// the system call and never runs the filter for it.
func evalSeccomp(prog []unix.SockFilter, d seccompData) (action uint32, constant bool, err error) {
	data := d.encode()
	constant = true
	var a uint32
	for pc := 0; pc < len(prog); pc++ {
		ins := prog[pc]
		jump := func(cond bool) error {
			off := int(ins.Jf)
			if cond {
				off = int(ins.Jt)
			}
			if pc+1+off >= len(prog) {
				return fmt.Errorf("instruction %d jumps past the end", pc)
			}
			pc += off
			return nil
		}
		var err error
		switch ins.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			if ins.K%4 != 0 || ins.K+4 > seccompDataSize {
				return 0, false, fmt.Errorf("instruction %d loads offset %d", pc, ins.K)
			}
			if ins.K != seccompDataNr && ins.K != seccompDataArch {
				constant = false
			}
			a = binary.LittleEndian.Uint32(data[ins.K:])
		case unix.BPF_ALU | unix.BPF_AND | unix.BPF_K:
			a &= ins.K
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
			err = jump(a == ins.K)
		case unix.BPF_JMP | unix.BPF_JGT | unix.BPF_K:
			err = jump(a > ins.K)
		case unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K:
			err = jump(a >= ins.K)
		case unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			err = jump(a&ins.K != 0)
		case unix.BPF_RET | unix.BPF_K:
			return ins.K, constant, nil
		default:
			return 0, false, fmt.Errorf("instruction %d: unsupported opcode %#x", pc, ins.Code)
		}
		if err != nil {
			return 0, false, err
		}
	}
	return 0, false, errors.New("fell off the end of the program")
}

func errnoAction(e unix.Errno) uint32 { return unix.SECCOMP_RET_ERRNO | uint32(e) }

func actionString(a uint32) string {
	switch {
	case a == unix.SECCOMP_RET_ALLOW:
		return "ALLOW"
	case a == unix.SECCOMP_RET_KILL_PROCESS:
		return "KILL_PROCESS"
	case a&unix.SECCOMP_RET_ACTION_FULL == unix.SECCOMP_RET_ERRNO:
		return "ERRNO(" + unix.ErrnoName(unix.Errno(a&unix.SECCOMP_RET_DATA)) + ")"
	}
	return fmt.Sprintf("%#x", a)
}

// namespaceFlags lists the flags of newNamespaceFlags one by one.
var namespaceFlags = []struct {
	name string
	flag uint64
}{
	{"CLONE_NEWUSER", unix.CLONE_NEWUSER}, {"CLONE_NEWNS", unix.CLONE_NEWNS},
	{"CLONE_NEWNET", unix.CLONE_NEWNET}, {"CLONE_NEWPID", unix.CLONE_NEWPID},
	{"CLONE_NEWIPC", unix.CLONE_NEWIPC}, {"CLONE_NEWUTS", unix.CLONE_NEWUTS},
	{"CLONE_NEWCGROUP", unix.CLONE_NEWCGROUP}, {"CLONE_NEWTIME", unix.CLONE_NEWTIME},
}

// TestSeccompProgram evaluates the filter on crafted seccomp_data, without
// a kernel.
func TestSeccompProgram(t *testing.T) {
	prog, err := seccompProgram()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d instructions", len(prog))
	var all uint64
	for _, f := range namespaceFlags {
		all |= f.flag
	}
	if all != newNamespaceFlags {
		t.Errorf("namespaceFlags (%#x) and newNamespaceFlags (%#x) differ", all, newNamespaceFlags)
	}
	if len(prog) > bpfMaxInsns {
		t.Errorf("%d instructions, the kernel takes %d", len(prog), bpfMaxInsns)
	}
	x86 := func(nr uint32, arg0 uint64) seccompData {
		return seccompData{arch: unix.AUDIT_ARCH_X86_64, nr: nr, args: [6]uint64{arg0, 1, 2, 3, 4, 5}}
	}
	const sigchld = uint64(unix.SIGCHLD)
	const threadFlags = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_THREAD |
		unix.CLONE_SYSVSEM | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID
	allow, eperm, enosys := uint32(unix.SECCOMP_RET_ALLOW), errnoAction(unix.EPERM), errnoAction(unix.ENOSYS)
	type tc struct {
		name string
		in   seccompData
		want uint32
	}
	tests := []tc{
		{"getpid", x86(unix.SYS_GETPID, 0), allow},
		{"execve", x86(unix.SYS_EXECVE, 0), allow},
		{"i386 getpid (int 0x80)", seccompData{arch: unix.AUDIT_ARCH_I386, nr: 20}, unix.SECCOMP_RET_KILL_PROCESS},
		{"i386 unshare", seccompData{arch: unix.AUDIT_ARCH_I386, nr: 310, args: [6]uint64{unix.CLONE_NEWUSER}}, unix.SECCOMP_RET_KILL_PROCESS},
		{"unknown arch", seccompData{arch: 0, nr: unix.SYS_GETPID}, unix.SECCOMP_RET_KILL_PROCESS},
		{"x32 getpid", x86(x32SyscallBit|unix.SYS_GETPID, 0), enosys},
		{"x32 mount", x86(x32SyscallBit|unix.SYS_MOUNT, 0), enosys},
		{"x32 unshare CLONE_NEWUSER", x86(x32SyscallBit|unix.SYS_UNSHARE, unix.CLONE_NEWUSER), enosys},
		{"nr -1 (a tracer skipping the call)", x86(0xffffffff, 0), enosys},
		{"fork (clone SIGCHLD)", x86(unix.SYS_CLONE, sigchld), allow},
		{"pthread_create (clone)", x86(unix.SYS_CLONE, threadFlags), allow},
		{"vfork (clone CLONE_VM|CLONE_VFORK)", x86(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_VFORK|sigchld), allow},
		// The kernel uses only the low 32 bits of clone's flags, so
		// namespace bits above them create nothing ...
		{"clone CLONE_NEWUSER<<32", x86(unix.SYS_CLONE, unix.CLONE_NEWUSER<<32|sigchld), allow},
		// ... and cannot hide namespace bits below them.
		{"clone CLONE_NEWUSER|1<<40", x86(unix.SYS_CLONE, 1<<40|unix.CLONE_NEWUSER|sigchld), eperm},
		{"unshare 0", x86(unix.SYS_UNSHARE, 0), allow},
		{"unshare CLONE_FILES|CLONE_FS|CLONE_SYSVSEM", x86(unix.SYS_UNSHARE, unix.CLONE_FILES|unix.CLONE_FS|unix.CLONE_SYSVSEM), allow},
		{"unshare -Urn", x86(unix.SYS_UNSHARE, unix.CLONE_NEWUSER|unix.CLONE_NEWNS|unix.CLONE_NEWNET), eperm},
		{"unshare CLONE_NEWUSER<<32 (EINVAL from the kernel)", x86(unix.SYS_UNSHARE, unix.CLONE_NEWUSER<<32), allow},
		{"clone3", x86(unix.SYS_CLONE3, 0), enosys},
		{"personality PER_LINUX", x86(unix.SYS_PERSONALITY, perLinux), allow},
		{"personality query", x86(unix.SYS_PERSONALITY, personalityQuery), allow},
		{"personality 1<<32 (PER_LINUX to the kernel)", x86(unix.SYS_PERSONALITY, 1<<32), allow},
		{"personality PER_LINUX32", x86(unix.SYS_PERSONALITY, 0x0008), eperm},
		{"personality READ_IMPLIES_EXEC", x86(unix.SYS_PERSONALITY, 0x0400000), eperm},
		{"personality ADDR_NO_RANDOMIZE", x86(unix.SYS_PERSONALITY, 0x0040000), eperm},
		{"personality 1<<32|PER_LINUX32", x86(unix.SYS_PERSONALITY, 1<<32|0x0008), eperm},
		{"personality 0xfffffffe", x86(unix.SYS_PERSONALITY, 0xfffffffe), eperm},
	}
	for _, f := range namespaceFlags {
		tests = append(tests,
			tc{"clone " + f.name, x86(unix.SYS_CLONE, f.flag|sigchld), eperm},
			tc{"unshare " + f.name, x86(unix.SYS_UNSHARE, f.flag), eperm})
	}
	names, nrs := map[string]bool{}, map[uint32]bool{}
	for _, r := range seccompDenyList() {
		if names[r.name] || nrs[r.nr] {
			t.Errorf("rule %s (%d) is listed twice", r.name, r.nr)
		}
		names[r.name], nrs[r.nr] = true, true
		if r.why == "" || r.errno == 0 {
			t.Errorf("rule %s lacks a reason or an errno", r.name)
		}
		if r.denyFlags == 0 && r.allowArg0 == nil {
			tests = append(tests, tc{r.name, x86(r.nr, 0), errnoAction(r.errno)})
		}
	}
	for _, tt := range tests {
		got, _, err := evalSeccomp(prog, tt.in)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		if got != tt.want {
			t.Errorf("%s (nr %#x, arg0 %#x): %s, want %s", tt.name, tt.in.nr, tt.in.args[0], actionString(got), actionString(tt.want))
		}
	}

	// Every other call is allowed on nr and arch alone, so the kernel
	// caches it and never runs the filter for it.
	for nr := range uint32(1024) {
		if nrs[nr] {
			continue
		}
		got, constant, err := evalSeccomp(prog, x86(nr, 0xffffffff))
		if err != nil || got != allow || !constant {
			t.Errorf("nr %d: %s (constant %v, %v), want a constant ALLOW", nr, actionString(got), constant, err)
		}
	}
}

func TestBuildSeccompProgramRejects(t *testing.T) {
	bad := []seccompRule{{name: "x", nr: 1, errno: unix.EPERM, denyFlags: 1, allowArg0: []uint32{0}}}
	if _, err := buildSeccompProgram(unix.AUDIT_ARCH_X86_64, bad); err == nil {
		t.Error("a rule with both argument checks was accepted")
	}
}

// TestSeccompDocumented checks that docs/sandbox.md names every denied call.
func TestSeccompDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/sandbox.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range seccompDenyList() {
		if !strings.Contains(string(doc), "`"+r.name+"`") {
			t.Errorf("docs/sandbox.md does not mention `%s`", r.name)
		}
	}
}

// onThrowawayThread runs f on an OS thread that is discarded afterwards, so
// f may change thread state (credentials, a seccomp filter) that must not
// leak into the rest of the test binary: a goroutine that exits while locked
// takes its thread with it, and the runtime never clones new threads from a
// locked one (it asks a clean thread to do it).
func onThrowawayThread(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked
		f()
	}()
	<-done
}

// TestSeccompKernel installs the filter on a throwaway thread and makes
// real system calls. EPERM is swapped for a marker errno none of these
// calls returns by itself, so a marker proves the filter (not a missing
// capability) said no. The thread runs unprivileged with every argument -1
// (bad fd, bad pointer, bad flags), so that a call the filter failed to stop
// would fail harmlessly. Needs neither root nor namespaces.
func TestSeccompKernel(t *testing.T) {
	const marker = unix.EHWPOISON
	rules := seccompDenyList()
	for i := range rules {
		if rules[i].errno == unix.EPERM {
			rules[i].errno = marker
		}
	}
	prog, err := buildSeccompProgram(unix.AUDIT_ARCH_X86_64, rules)
	if err != nil {
		t.Fatal(err)
	}
	type probe struct {
		name string
		nr   uint32
		args [6]uintptr
		want unix.Errno // 0: the call succeeds
	}
	bad := [6]uintptr{^uintptr(0), ^uintptr(0), ^uintptr(0), ^uintptr(0), ^uintptr(0), ^uintptr(0)}
	var probes []probe
	for _, r := range rules {
		if r.denyFlags == 0 && r.allowArg0 == nil {
			probes = append(probes, probe{r.name, r.nr, bad, r.errno})
		}
	}
	args := func(a ...uintptr) (v [6]uintptr) { copy(v[:], a); return v }
	probes = append(probes,
		probe{"getpid", unix.SYS_GETPID, bad, 0},
		// clone3 would fail with E2BIG for a size of -1.
		probe{"clone3", unix.SYS_CLONE3, bad, unix.ENOSYS},
		probe{"unshare 0", unix.SYS_UNSHARE, args(0), 0},
		probe{"unshare CLONE_NEWUSER<<32", unix.SYS_UNSHARE, args(unix.CLONE_NEWUSER << 32), unix.EINVAL},
		// CLONE_THREAD without CLONE_SIGHAND: EINVAL from the kernel, which
		// shows the call got past the filter.
		probe{"clone CLONE_THREAD", unix.SYS_CLONE, args(unix.CLONE_THREAD), unix.EINVAL},
		probe{"clone CLONE_NEWUSER<<32|CLONE_THREAD", unix.SYS_CLONE, args(unix.CLONE_NEWUSER<<32 | unix.CLONE_THREAD), unix.EINVAL},
		probe{"clone CLONE_NEWUSER|CLONE_THREAD", unix.SYS_CLONE, args(unix.CLONE_NEWUSER | unix.CLONE_THREAD), marker},
		probe{"personality query", unix.SYS_PERSONALITY, args(personalityQuery), 0},
		probe{"personality PER_LINUX", unix.SYS_PERSONALITY, args(perLinux), 0},
		probe{"personality PER_LINUX32", unix.SYS_PERSONALITY, args(0x0008), marker},
		probe{"personality READ_IMPLIES_EXEC", unix.SYS_PERSONALITY, args(0x0400000), marker},
		probe{"personality 1<<32|READ_IMPLIES_EXEC", unix.SYS_PERSONALITY, args(1<<32 | 0x0400000), marker},
	)
	for _, f := range namespaceFlags {
		probes = append(probes,
			probe{"unshare " + f.name, unix.SYS_UNSHARE, args(uintptr(f.flag)), marker},
			probe{"clone " + f.name + "|CLONE_THREAD", unix.SYS_CLONE, args(uintptr(f.flag) | unix.CLONE_THREAD), marker})
	}

	got := make([]unix.Errno, len(probes))
	var setupErr error
	var mode uintptr
	onThrowawayThread(func() {
		if os.Geteuid() == 0 {
			// This thread only (raw calls, unlike syscall.Setuid).
			const nobody = 65534
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, nobody, nobody, nobody); e != 0 {
				setupErr = fmt.Errorf("setresgid: %w", e)
				return
			}
			if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, nobody, nobody, nobody); e != 0 {
				setupErr = fmt.Errorf("setresuid: %w", e)
				return
			}
		}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			setupErr = fmt.Errorf("no_new_privs: %w", err)
			return
		}
		if err := loadSeccomp(prog); err != nil {
			setupErr = err
			return
		}
		mode, _, _ = unix.RawSyscall(unix.SYS_PRCTL, unix.PR_GET_SECCOMP, 0, 0)
		for i, p := range probes {
			_, _, got[i] = unix.RawSyscall6(uintptr(p.nr), p.args[0], p.args[1], p.args[2], p.args[3], p.args[4], p.args[5])
		}
	})
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	if mode != unix.SECCOMP_MODE_FILTER {
		t.Errorf("PR_GET_SECCOMP on the thread = %d, want %d", mode, unix.SECCOMP_MODE_FILTER)
	}
	for i, p := range probes {
		if got[i] != p.want {
			t.Errorf("%s: errno %s, want %s", p.name, errnoName(got[i]), errnoName(p.want))
		}
	}
	// The filter stayed on the throwaway thread.
	if m, _, _ := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_GET_SECCOMP, 0, 0); m != 0 {
		t.Errorf("PR_GET_SECCOMP on the test's thread = %d", m)
	}
}

func errnoName(e unix.Errno) string {
	if e == 0 {
		return "none"
	}
	return unix.ErrnoName(e)
}

// probeScript is Python that runs each probe in a child process of its own
// and prints "<probe> <result>", where result is ok, an errno name or
// SIGSYS; probes named in its arguments are skipped ("-").
const probeScript = `
import ctypes, errno, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
M = (1 << 64) - 1

def sc(nr, *args):
    a = [ctypes.c_ulong(x & M) if isinstance(x, int) else x for x in args]
    r = libc.syscall(ctypes.c_long(nr), *a)
    return errno.errorcode.get(ctypes.get_errno(), "?") if r == -1 else "ok"

def clone(flags):
    # a raw clone (like fork) with the flags; the child leaves at once
    r = libc.syscall(ctypes.c_long(SYS_CLONE), ctypes.c_ulong((flags | 17) & M), ctypes.c_ulong(0),
                     ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if r == 0:
        os._exit(0)
    if r == -1:
        return errno.errorcode.get(ctypes.get_errno(), "?")
    os.waitpid(r, 0)
    return "ok"

def run(argv):
    p = subprocess.run(argv, capture_output=True)
    if p.returncode == 0:
        return "ok"
    if p.returncode == -31:
        return "SIGSYS"
    if b"Operation not permitted" in p.stderr:
        return "EPERM"
    return "rc=%d:%s" % (p.returncode, p.stderr.decode().strip().replace(" ", "_")[-80:])

# i386 getpid through int 0x80, from a 64-bit process
INT80 = """
import ctypes, mmap
buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3]))  # mov eax, 20; int 0x80; ret
f = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
assert f() > 0
"""

probes = [
PROBES
]
def forked(f):
    # in a child, so that what a probe changes (its namespaces, persona)
    # cannot affect the next one
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            res = f()
        except Exception as e:
            res = "exception:" + type(e).__name__
        os.write(w, res.encode())
        os._exit(0)
    os.close(w)
    res = os.read(r, 200).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return res

skip = set(sys.argv[1:])
for name, f in probes:
    print(name, "-" if name in skip else forked(f), flush=True)
`

// uffdUserModeOnly is UFFD_USER_MODE_ONLY (include/uapi/linux/userfaultfd.h),
// the userfaultfd flag unprivileged processes may use.
const uffdUserModeOnly = 1

// TestSeccompSandbox attacks the filter from inside a sandbox with Python
// and ctypes, and runs the same probes as an unprivileged process on the
// host, without a filter, to show what the filter adds.
func TestSeccompSandbox(t *testing.T) {
	m := newTestManager(t)
	// py is a probe making one raw system call.
	py := func(nr uint32, args ...string) string {
		return fmt.Sprintf(`    ("", lambda: sc(%d%s)),`, nr, strings.Join(append([]string{""}, args...), ", "))
	}
	x := func(v uint64) string { return fmt.Sprintf("%#x", v) }
	probes := []struct {
		name, code string
		want       string // in the sandbox
		hostSafe   bool   // also run on the host
	}{
		{"unshare-newuser", py(unix.SYS_UNSHARE, x(unix.CLONE_NEWUSER)), "EPERM", true},
		{"unshare-newuser-newns-newnet", py(unix.SYS_UNSHARE, x(unix.CLONE_NEWUSER|unix.CLONE_NEWNS|unix.CLONE_NEWNET)), "EPERM", true},
		{"unshare-binary", `    ("", lambda: run(["/usr/bin/unshare", "--user", "--map-root-user", "/bin/true"])),`, "EPERM", true},
		{"clone-newuser", `    ("", lambda: clone(` + x(unix.CLONE_NEWUSER) + `)),`, "EPERM", true},
		// Creates nothing: the kernel reads only the low 32 bits.
		{"clone-newuser-high-bits", `    ("", lambda: clone(` + x(unix.CLONE_NEWUSER<<32) + `)),`, "ok", true},
		{"clone3", py(unix.SYS_CLONE3, "None", "0"), "ENOSYS", true},
		{"setns", py(unix.SYS_SETNS, "-1", "0"), "EPERM", true},
		{"mount-tmpfs", py(unix.SYS_MOUNT, `b"none"`, `b"/tmp"`, `b"tmpfs"`, "0", "None"), "EPERM", true},
		// The filter answers before the kernel looks at the arguments.
		{"mount-bad-pointers", py(unix.SYS_MOUNT, "None", "None", "None", "0", "None"), "EPERM", true},
		{"keyctl-session-keyring", py(unix.SYS_KEYCTL, "0", "-3", "1"), "EPERM", true},
		{"bpf-map-create", py(unix.SYS_BPF, "0", "None", "0"), "EPERM", true},
		{"perf_event_open", py(unix.SYS_PERF_EVENT_OPEN, "None", "0", "-1", "-1", "0"), "EPERM", true},
		{"io_uring_setup", py(unix.SYS_IO_URING_SETUP, "1", "ctypes.create_string_buffer(120)"), "EPERM", true},
		{"userfaultfd-user-mode", py(unix.SYS_USERFAULTFD, x(unix.O_CLOEXEC|uffdUserModeOnly)), "EPERM", true},
		// Not on the host: the test binary would become the probe's tracer.
		{"ptrace-traceme", py(unix.SYS_PTRACE, x(unix.PTRACE_TRACEME), "0", "0", "0"), "EPERM", false},
		{"personality-per-linux32", py(unix.SYS_PERSONALITY, "0x0008"), "EPERM", true},
		{"personality-read-implies-exec", py(unix.SYS_PERSONALITY, "0x0400000"), "EPERM", true},
		{"personality-query", py(unix.SYS_PERSONALITY, "0xffffffff"), "ok", true},
		{"i386-int80-getpid", `    ("", lambda: run([sys.executable, "-c", INT80])),`, "SIGSYS", true},
		// ENOSYS with or without the filter on kernels without x32 support.
		{"x32-getpid", py(x32SyscallBit | unix.SYS_GETPID), "ENOSYS", true},
		{"seccomp-status", `    ("", lambda: ",".join(l.split(":")[1].strip() for l in open("/proc/self/status") if l.startswith("Seccomp"))),`, "2,1", false},
	}
	var lines []string
	var hostSkip []string
	for _, p := range probes {
		lines = append(lines, strings.Replace(p.code, `("",`, fmt.Sprintf("(%q,", p.name), 1))
		if !p.hostSafe {
			hostSkip = append(hostSkip, p.name)
		}
	}
	script := strings.NewReplacer("SYS_CLONE", fmt.Sprint(unix.SYS_CLONE), "PROBES", strings.Join(lines, "\n")).Replace(probeScript)

	uid := testUID()
	spec := Spec{
		ID: "seccomp-probes", UID: uid, GID: uid,
		Argv:   []string{"/usr/bin/python3", "-c", script},
		Limits: Limits{MemoryMB: 128, Pids: 32},
	}
	o := runSandbox(t, m, spec)
	if o.status != (ExitStatus{}) {
		t.Fatalf("probes exited %+v; stdout:\n%s\nstderr:\n%s", o.status, o.stdout, o.stderr)
	}
	inside := parseProbes(o.stdout)

	// The same probes on the host, as an unprivileged uid, without a filter.
	hostUID := testUID()
	cmd := exec.Command("/usr/bin/python3", append([]string{"-c", script}, hostSkip...)...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(hostUID), Gid: uint32(hostUID)}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("probes on the host: %v\n%s", err, out)
	}
	host := parseProbes(string(out))

	t.Logf("%-32s %-12s %s", "probe", "host", "sandbox")
	for _, p := range probes {
		t.Logf("%-32s %-12s %s", p.name, host[p.name], inside[p.name])
		if inside[p.name] != p.want {
			t.Errorf("%s in the sandbox: %q, want %q", p.name, inside[p.name], p.want)
		}
	}
	if host["unshare-newuser"] != "ok" {
		t.Logf("this host refuses unprivileged user namespaces by itself (unshare: %s; see sysctl user.max_user_namespaces): the sandbox result shows the filter is installed, not that it is needed here", host["unshare-newuser"])
	} else {
		t.Logf("an unprivileged process on this host can create a user namespace: the filter is what stops it in the sandbox")
	}
	if host["i386-int80-getpid"] != "ok" {
		t.Logf("int 0x80 does not work on this host (%s; CONFIG_IA32_EMULATION off?)", host["i386-int80-getpid"])
	}
}

func parseProbes(out string) map[string]string {
	res := map[string]string{}
	for line := range strings.Lines(out) {
		if name, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			res[name] = v
		}
	}
	return res
}

// TestSeccompAllowsNormalWork runs what functions commonly do under the
// filter: threads, subprocesses, multiprocessing, fork, sockets, clocks.
func TestSeccompAllowsNormalWork(t *testing.T) {
	m := newTestManager(t)
	const script = `
import multiprocessing, os, socket, subprocess, threading, time

def check(name, f):
    try:
        print(name, "ok" if f() else "wrong", flush=True)
    except Exception as e:
        print(name, "exception:%s:%s" % (type(e).__name__, e), flush=True)

def threads():
    out = []
    ts = [threading.Thread(target=out.append, args=(i,)) for i in range(4)]
    for t in ts: t.start()
    for t in ts: t.join()
    return sorted(out) == [0, 1, 2, 3]

def fork():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7

def square(x):
    return x * x

def pool():
    with multiprocessing.get_context("fork").Pool(2) as p:
        return p.map(square, range(5)) == [0, 1, 4, 9, 16]

def process():
    p = multiprocessing.get_context("fork").Process(target=os._exit, args=(3,))
    p.start(); p.join()
    return p.exitcode == 3

def tcp():
    srv = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(srv.getsockname(), timeout=5)
    s, _ = srv.accept()
    c.sendall(b"ping")
    ok = s.recv(4) == b"ping"
    for x in (c, s, srv): x.close()
    return ok

def udp():
    a, b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.bind(("127.0.0.1", 0))
    b.sendto(b"x", a.getsockname())
    return a.recv(1) == b"x"

def unix_pair():
    a, b = socket.socketpair()
    a.sendall(b"y")
    return b.recv(1) == b"y"

def clocks():
    t0 = time.monotonic()
    time.sleep(0.01)
    return (time.time() > 1.6e9 and time.monotonic() - t0 >= 0.01 and time.process_time() >= 0
            and time.clock_gettime(time.CLOCK_BOOTTIME) > 0 and time.perf_counter_ns() > 0)

check("threads", threads)
check("subprocess", lambda: subprocess.run(["/bin/echo", "hi"], capture_output=True).stdout == b"hi\n")
check("shell-pipeline", lambda: subprocess.run("echo hi | tr a-z A-Z", shell=True, capture_output=True).stdout == b"HI\n")
check("os.fork", fork)
check("multiprocessing-pool", pool)
check("multiprocessing-process", process)
check("tcp-loopback", tcp)
check("udp-loopback", udp)
check("socketpair", unix_pair)
check("clocks", clocks)
check("urandom", lambda: len(os.urandom(16)) == 16)
check("uname", lambda: os.uname().sysname == "Linux")
`
	uid := testUID()
	spec := Spec{
		ID: "seccomp-normal", UID: uid, GID: uid,
		Argv:   []string{"/usr/bin/python3", "-c", script},
		Limits: Limits{MemoryMB: 256, Pids: 64},
	}
	o := runSandbox(t, m, spec)
	if o.status != (ExitStatus{}) {
		t.Errorf("exit status %+v, stderr:\n%s", o.status, o.stderr)
	}
	got := parseProbes(o.stdout)
	for _, name := range []string{"threads", "subprocess", "shell-pipeline", "os.fork", "multiprocessing-pool",
		"multiprocessing-process", "tcp-loopback", "udp-loopback", "socketpair", "clocks", "urandom", "uname"} {
		if got[name] != "ok" {
			t.Errorf("%s: %q", name, got[name])
		}
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", o.stdout, o.stderr)
	}
}

// BenchmarkSeccompSyscall measures what the filter costs a system call,
// against the same call without it in the same run: getpid, which the
// kernel's per-syscall cache lets through without running the filter, and
// personality(0xffffffff), which runs it to the end (the filter inspects
// its argument). Each sub-benchmark runs on a thread of its own that is
// discarded afterwards. Run with
//
//	go test -run '^$' -bench SeccompSyscall ./internal/sandbox/
func BenchmarkSeccompSyscall(b *testing.B) {
	prog, err := seccompProgram()
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		nr, arg0 uintptr
	}{{"getpid", unix.SYS_GETPID, 0}, {"personality-query", unix.SYS_PERSONALITY, personalityQuery}} {
		var base float64
		b.Run(c.name+"/unfiltered", func(b *testing.B) {
			base = syscallLoop(b, nil, c.nr, c.arg0)
		})
		b.Run(c.name+"/filtered", func(b *testing.B) {
			ns := syscallLoop(b, prog, c.nr, c.arg0)
			if base > 0 {
				b.ReportMetric(ns/base, "x-unfiltered")
			}
		})
	}
}

// syscallLoop makes the call b.N times on a thread locked for good (so the
// runtime discards it when the benchmark goroutine ends), under prog unless
// nil, and returns ns per call.
func syscallLoop(b *testing.B, prog []unix.SockFilter, nr, arg0 uintptr) float64 {
	runtime.LockOSThread() // never unlocked: see onThrowawayThread
	if mode, _, _ := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_GET_SECCOMP, 0, 0); prog != nil && mode == 0 {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			b.Fatal(err)
		}
		if err := loadSeccomp(prog); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		unix.RawSyscall(nr, arg0, 0, 0)
	}
	return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}
