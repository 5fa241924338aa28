//go:build amd64

package sandbox

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The seccomp filter every sandboxed program runs under.
//
// It is a deny-list: the program may make any system call except those in
// seccompDenyList, the kernel's usual attack surface that no function has
// business with (namespaces, mounts, BPF, io_uring, keyrings, ptrace, kernel
// modules, clocks ...). Most of them already fail for an unprivileged uid;
// the filter makes them fail before the kernel parses a single argument, and
// it closes the ones that work without privileges, above all
// unshare(CLONE_NEWUSER), which would hand the function every capability in
// a new user namespace and with them the whole mount, netfilter and
// namespace code of the kernel.
//
// The filter is written for the x86_64 system call ABI only. A call made
// through another ABI of the same process (int 0x80 i386 compat calls, whose
// numbers differ, or x32 numbers, which have bit 30 set) would slip past a
// table of x86_64 numbers, so: a foreign arch kills the process, an x32
// number fails with ENOSYS, as on a kernel built without x32.
//
// The kernel (5.11+) runs the filter once per system call number when it is
// installed and caches those it always allows without looking at
// arguments: for them the BPF program never runs, and what remains is the
// slower system call entry of any thread with a filter (20-50 ns per call
// on the development VM, see BenchmarkSeccompSyscall). Only clone,
// unshare and personality (whose arguments are inspected) and the denied
// calls run the program, a binary search of about ten instructions.

// Offsets in struct seccomp_data (include/uapi/linux/seccomp.h): int nr;
// __u32 arch; __u64 instruction_pointer; __u64 args[6]. x86_64 is little
// endian, so the low 32 bits of args[i] are at 16+8i.
const (
	seccompDataNr      = 0
	seccompDataArch    = 4
	seccompDataArgsLow = 16
	seccompDataSize    = 64
)

// x32SyscallBit marks x32 system call numbers (__X32_SYSCALL_BIT in
// arch/x86/include/uapi/asm/unistd.h).
const x32SyscallBit = 0x40000000

// newNamespaceFlags are the clone/unshare flags that create a namespace.
// CLONE_NEWTIME (0x80) lies within CSIGNAL for clone(2), where it cannot be
// requested and the bit would be an exit signal above 64, which the kernel
// rejects anyway: denying it there costs nothing.
const newNamespaceFlags = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWNET |
	unix.CLONE_NEWPID | unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP |
	unix.CLONE_NEWTIME

// Values of personality(2)'s argument (include/uapi/linux/personality.h)
// the filter lets through.
const (
	perLinux         = 0          // PER_LINUX: the default, which every process already has
	personalityQuery = 0xffffffff // return the current persona without changing it
)

// seccompRule is one row of the deny-list.
type seccompRule struct {
	name  string     // the kernel's name, as in arch/x86/entry/syscalls/syscall_64.tbl
	nr    uint32     // x86_64 system call number
	errno unix.Errno // what the denied call fails with
	// denyFlags, when non-zero, denies the call only if the low 32 bits
	// of args[0] have one of these bits set.
	denyFlags uint32
	// allowArg0, when non-nil, denies the call unless the low 32 bits of
	// args[0] are one of these values.
	allowArg0 []uint32
	why       string
}

// seccompDenyList returns the system calls the filter denies, with the
// reason for each. It is a function, not a package-level table, so that
// nothing can change it and the worker does not build it at start-up.
//
// The order does not matter (the program searches by number); rows are
// grouped by subsystem.
func seccompDenyList() []seccompRule {
	const nsWhy = "creates namespaces: a new user namespace grants every capability inside it and exposes the mount, network and namespace code of the kernel to the function"
	const mount = "the mount API: the function's view of the filesystem is fixed; with a user namespace it would be a large unprivileged attack surface"
	const clock = "sets the host's clock"
	return []seccompRule{
		{name: "clone", nr: unix.SYS_CLONE, errno: unix.EPERM, denyFlags: newNamespaceFlags, why: nsWhy + "; the kernel reads only the low 32 bits of the flags"},
		{name: "unshare", nr: unix.SYS_UNSHARE, errno: unix.EPERM, denyFlags: newNamespaceFlags, why: nsWhy},
		{name: "clone3", nr: unix.SYS_CLONE3, errno: unix.ENOSYS, why: "its flags live in memory, which BPF cannot read; with ENOSYS glibc falls back to clone, whose flags the filter checks (Docker's profile does the same)"},
		{name: "personality", nr: unix.SYS_PERSONALITY, errno: unix.EPERM, allowArg0: []uint32{perLinux, personalityQuery}, why: "other personas weaken the process (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE turns off ASLR) or select rarely used kernel code; PER_LINUX and the query stay allowed"},
		{name: "setns", nr: unix.SYS_SETNS, errno: unix.EPERM, why: "joins namespaces"},
		{name: "mount", nr: unix.SYS_MOUNT, errno: unix.EPERM, why: mount},
		{name: "umount2", nr: unix.SYS_UMOUNT2, errno: unix.EPERM, why: mount},
		{name: "pivot_root", nr: unix.SYS_PIVOT_ROOT, errno: unix.EPERM, why: mount},
		{name: "open_tree", nr: unix.SYS_OPEN_TREE, errno: unix.EPERM, why: mount},
		{name: "open_tree_attr", nr: unix.SYS_OPEN_TREE_ATTR, errno: unix.EPERM, why: mount + " (Linux 6.15+)"},
		{name: "move_mount", nr: unix.SYS_MOVE_MOUNT, errno: unix.EPERM, why: mount},
		{name: "fsopen", nr: unix.SYS_FSOPEN, errno: unix.EPERM, why: mount},
		{name: "fsconfig", nr: unix.SYS_FSCONFIG, errno: unix.EPERM, why: mount},
		{name: "fsmount", nr: unix.SYS_FSMOUNT, errno: unix.EPERM, why: mount},
		{name: "fspick", nr: unix.SYS_FSPICK, errno: unix.EPERM, why: mount},
		{name: "mount_setattr", nr: unix.SYS_MOUNT_SETATTR, errno: unix.EPERM, why: mount},
		{name: "bpf", nr: unix.SYS_BPF, errno: unix.EPERM, why: "eBPF verifier and JIT: a recurring source of kernel exploits"},
		{name: "perf_event_open", nr: unix.SYS_PERF_EVENT_OPEN, errno: unix.EPERM, why: "a large, often exploited subsystem; also a side channel on other tenants"},
		{name: "userfaultfd", nr: unix.SYS_USERFAULTFD, errno: unix.EPERM, why: "lets an exploit stall the kernel at a chosen page fault to win races"},
		{name: "io_uring_setup", nr: unix.SYS_IO_URING_SETUP, errno: unix.EPERM, why: "io_uring: a large attack surface that also bypasses per-call seccomp checks (runtimes fall back to plain calls)"},
		{name: "io_uring_enter", nr: unix.SYS_IO_URING_ENTER, errno: unix.EPERM, why: "io_uring, as above"},
		{name: "io_uring_register", nr: unix.SYS_IO_URING_REGISTER, errno: unix.EPERM, why: "io_uring, as above"},
		{name: "keyctl", nr: unix.SYS_KEYCTL, errno: unix.EPERM, why: "kernel keyrings are not namespaced: shared with every process of the uid on the host"},
		{name: "add_key", nr: unix.SYS_ADD_KEY, errno: unix.EPERM, why: "kernel keyrings, as above"},
		{name: "request_key", nr: unix.SYS_REQUEST_KEY, errno: unix.EPERM, why: "kernel keyrings, as above; can also make the kernel run a helper on the host"},
		{name: "ptrace", nr: unix.SYS_PTRACE, errno: unix.EPERM, why: "other instances are out of reach (uid, PID namespace), but processes of the same instance are not, and ptrace is a classic kernel attack surface; Python does not need it"},
		{name: "kexec_load", nr: unix.SYS_KEXEC_LOAD, errno: unix.EPERM, why: "loads a new kernel"},
		{name: "kexec_file_load", nr: unix.SYS_KEXEC_FILE_LOAD, errno: unix.EPERM, why: "loads a new kernel"},
		{name: "init_module", nr: unix.SYS_INIT_MODULE, errno: unix.EPERM, why: "loads kernel modules"},
		{name: "finit_module", nr: unix.SYS_FINIT_MODULE, errno: unix.EPERM, why: "loads kernel modules"},
		{name: "delete_module", nr: unix.SYS_DELETE_MODULE, errno: unix.EPERM, why: "unloads kernel modules"},
		{name: "reboot", nr: unix.SYS_REBOOT, errno: unix.EPERM, why: "reboots the host"},
		{name: "swapon", nr: unix.SYS_SWAPON, errno: unix.EPERM, why: "changes the host's swap"},
		{name: "swapoff", nr: unix.SYS_SWAPOFF, errno: unix.EPERM, why: "changes the host's swap"},
		{name: "acct", nr: unix.SYS_ACCT, errno: unix.EPERM, why: "switches the host's process accounting"},
		{name: "quotactl", nr: unix.SYS_QUOTACTL, errno: unix.EPERM, why: "filesystem quotas of the host"},
		{name: "quotactl_fd", nr: unix.SYS_QUOTACTL_FD, errno: unix.EPERM, why: "filesystem quotas of the host"},
		{name: "lookup_dcookie", nr: unix.SYS_LOOKUP_DCOOKIE, errno: unix.EPERM, why: "profiling interface that reveals host paths (removed in Linux 6.9)"},
		{name: "open_by_handle_at", nr: unix.SYS_OPEN_BY_HANDLE_AT, errno: unix.EPERM, why: "opens files by handle, bypassing the mount namespace (the 'shocker' container escape)"},
		{name: "name_to_handle_at", nr: unix.SYS_NAME_TO_HANDLE_AT, errno: unix.EPERM, why: "the other half of open_by_handle_at; leaks inode handles"},
		{name: "iopl", nr: unix.SYS_IOPL, errno: unix.EPERM, why: "raw I/O port access"},
		{name: "ioperm", nr: unix.SYS_IOPERM, errno: unix.EPERM, why: "raw I/O port access"},
		{name: "syslog", nr: unix.SYS_SYSLOG, errno: unix.EPERM, why: "reads or clears the host's kernel log (kernel addresses, other tenants' events)"},
		{name: "settimeofday", nr: unix.SYS_SETTIMEOFDAY, errno: unix.EPERM, why: clock},
		{name: "clock_settime", nr: unix.SYS_CLOCK_SETTIME, errno: unix.EPERM, why: clock},
		{name: "clock_adjtime", nr: unix.SYS_CLOCK_ADJTIME, errno: unix.EPERM, why: clock + " (also its read-only query: functions read clocks with clock_gettime)"},
		{name: "adjtimex", nr: unix.SYS_ADJTIMEX, errno: unix.EPERM, why: clock + " (also its read-only query, as above)"},
		{name: "vhangup", nr: unix.SYS_VHANGUP, errno: unix.EPERM, why: "hangs up the controlling terminal"},
		{name: "nfsservctl", nr: unix.SYS_NFSSERVCTL, errno: unix.EPERM, why: "the kernel NFS server's control call (gone since Linux 3.1; denied in case a kernel brings it back)"},
		{name: "uselib", nr: unix.SYS_USELIB, errno: unix.EPERM, why: "obsolete a.out library loader, rarely audited code"},
	}
}

// seccompProgram returns the filter the init installs.
func seccompProgram() ([]unix.SockFilter, error) {
	return buildSeccompProgram(unix.AUDIT_ARCH_X86_64, seccompDenyList())
}

// buildSeccompProgram assembles a classic BPF program that kills the
// process for a foreign arch, fails x32 calls with ENOSYS, applies the
// rule for the call's number and allows everything else.
//
// The rules are found by binary search on the number, not by a linear
// scan, because the kernel runs the program for every system call number
// when the filter is installed (to cache the always-allowed ones): with a
// linear scan of ~50 rules installing took 180 µs of every sandbox start,
// with the search 75-95 µs. All jumps are forward and every subtree ends in
// returns, so the program is built by concatenation, without labels.
func buildSeccompProgram(arch uint32, rules []seccompRule) ([]unix.SockFilter, error) {
	sorted := slices.Clone(rules)
	slices.SortFunc(sorted, func(a, b seccompRule) int { return cmp.Compare(a.nr, b.nr) })
	for i := 1; i < len(sorted); i++ {
		if sorted[i].nr == sorted[i-1].nr {
			return nil, fmt.Errorf("seccomp rules %s and %s: same number %d", sorted[i-1].name, sorted[i].name, sorted[i].nr)
		}
	}
	search, err := seccompSearch(sorted)
	if err != nil {
		return nil, err
	}
	prog := append([]unix.SockFilter{
		bpfLoad(seccompDataArch),
		bpfJumpIf(unix.BPF_JEQ, arch, 1, 0),
		bpfRet(unix.SECCOMP_RET_KILL_PROCESS),
		bpfLoad(seccompDataNr),
		bpfJumpIf(unix.BPF_JSET, x32SyscallBit, 0, 1),
		bpfRetErrno(unix.ENOSYS),
	}, search...)
	if len(prog) > bpfMaxInsns {
		return nil, fmt.Errorf("seccomp program has %d instructions, the kernel takes at most %d", len(prog), bpfMaxInsns)
	}
	return prog, nil
}

// seccompLeafRules is how many rules a leaf of the search compares one by
// one: fewer makes the tree deeper, more makes the scans longer.
const seccompLeafRules = 4

// seccompSearch returns code that, with the system call number in the
// accumulator, applies the rule among rules (sorted by number) that
// matches it, or allows the call.
func seccompSearch(rules []seccompRule) ([]unix.SockFilter, error) {
	if len(rules) > seccompLeafRules {
		mid := len(rules) / 2
		below, err := seccompSearch(rules[:mid])
		if err != nil {
			return nil, err
		}
		above, err := seccompSearch(rules[mid:])
		if err != nil {
			return nil, err
		}
		if len(below) > 255 {
			return nil, fmt.Errorf("seccomp program: %d instructions below %s do not fit a BPF jump", len(below), rules[mid].name)
		}
		// nr >= the middle rule's: skip the code for the lower half.
		code := []unix.SockFilter{bpfJumpIf(unix.BPF_JGE, rules[mid].nr, uint8(len(below)), 0)}
		return append(append(code, below...), above...), nil
	}
	var code []unix.SockFilter
	for _, r := range rules {
		block, err := seccompRuleBlock(r)
		if err != nil {
			return nil, err
		}
		code = append(code, bpfJumpIf(unix.BPF_JEQ, r.nr, 0, uint8(len(block))))
		code = append(code, block...)
	}
	return append(code, bpfRet(unix.SECCOMP_RET_ALLOW)), nil
}

// seccompRuleBlock returns the code that decides a call matching r. It
// ends in returns on every path: a block that loads an argument overwrites
// the number in the accumulator.
func seccompRuleBlock(r seccompRule) ([]unix.SockFilter, error) {
	switch {
	case r.denyFlags != 0 && r.allowArg0 != nil:
		return nil, fmt.Errorf("seccomp rule %s: both denyFlags and allowArg0 set", r.name)
	case r.denyFlags != 0:
		return []unix.SockFilter{
			bpfLoad(seccompDataArgsLow),
			bpfJumpIf(unix.BPF_JSET, r.denyFlags, 0, 1),
			bpfRetErrno(r.errno),
			bpfRet(unix.SECCOMP_RET_ALLOW),
		}, nil
	case r.allowArg0 != nil:
		if len(r.allowArg0) > 200 {
			return nil, fmt.Errorf("seccomp rule %s: %d allowed values do not fit a BPF jump", r.name, len(r.allowArg0))
		}
		block := []unix.SockFilter{bpfLoad(seccompDataArgsLow)}
		for i, v := range r.allowArg0 {
			// Skip the remaining comparisons and the errno, to the allow.
			block = append(block, bpfJumpIf(unix.BPF_JEQ, v, uint8(len(r.allowArg0)-i), 0))
		}
		return append(block, bpfRetErrno(r.errno), bpfRet(unix.SECCOMP_RET_ALLOW)), nil
	default:
		return []unix.SockFilter{bpfRetErrno(r.errno)}, nil
	}
}

// bpfMaxInsns is the kernel's limit on a classic BPF program (BPF_MAXINSNS).
const bpfMaxInsns = 4096

// bpfLoad loads the 32-bit word of seccomp_data at off into the accumulator.
func bpfLoad(off uint32) unix.SockFilter {
	return unix.SockFilter{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: off}
}

// bpfJumpIf compares the accumulator with k (op is BPF_JEQ, BPF_JSET ...)
// and skips jt instructions if true, jf if false.
func bpfJumpIf(op uint16, k uint32, jt, jf uint8) unix.SockFilter {
	return unix.SockFilter{Code: unix.BPF_JMP | op | unix.BPF_K, Jt: jt, Jf: jf, K: k}
}

// bpfRet ends the program with a seccomp action.
func bpfRet(action uint32) unix.SockFilter {
	return unix.SockFilter{Code: unix.BPF_RET | unix.BPF_K, K: action}
}

// bpfRetErrno ends the program: the call fails with errno.
func bpfRetErrno(errno unix.Errno) unix.SockFilter {
	return bpfRet(unix.SECCOMP_RET_ERRNO | uint32(errno)&unix.SECCOMP_RET_DATA)
}

// installSeccomp installs the filter on the calling thread, which must have
// no_new_privs set (or CAP_SYS_ADMIN).
//
// Only on the calling thread, without SECCOMP_FILTER_FLAG_TSYNC: the init
// calls it on its locked thread right before that thread execs, execve
// kills every other thread of the process, and the new program inherits the
// exec'ing thread's filter. The init's other threads never run anything but
// the Go runtime, and are gone before the program's first instruction.
func installSeccomp() error {
	prog, err := seccompProgram()
	if err != nil {
		return err
	}
	return loadSeccomp(prog)
}

// loadSeccomp installs prog on the calling thread.
func loadSeccomp(prog []unix.SockFilter) error {
	fprog := &unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(fprog)), 0, 0)
	// unix.Prctl takes a uintptr: keep what it points to alive.
	runtime.KeepAlive(fprog)
	runtime.KeepAlive(prog)
	if err != nil {
		return fmt.Errorf("install filter: %w", err)
	}
	return nil
}
