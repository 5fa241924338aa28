// Package sandbox starts programs in isolated sandboxes on one worker and
// tears them down.
//
// A sandbox is a process tree in new user (owned by the worker: see
// userMappings), mount, PID, IPC, UTS and (unless Spec.HostNetwork)
// network namespaces; it runs as the Spec's non-root
// uid/gid with no capabilities and no_new_privs, under a seccomp filter that
// denies the kernel's usual attack surface (see seccomp.go), on a read-only
// root built on a private tmpfs from the host's /usr, /etc and /lib* plus
// the Spec's binds, with a fresh /proc, a minimal read-only /dev whose shm
// points into a size-limited /tmp, rlimits, and a cgroup (v1 or v2, detected
// at start) that enforces its memory limit, CPU weight and pids limit. What
// to bind where, and which uid a function gets, is the worker's policy, not
// this package's.
//
// The Manager runs in the worker as root. Start re-executes a binary (by
// default the worker's own, /proc/self/exe; in production the small
// torpor-init, see FindInit) as the in-sandbox init: that
// binary must call IsInit and InitMain first thing in main, before anything
// else runs. The init receives its instructions as JSON on a pipe, builds the
// sandbox from inside the new namespaces, drops every privilege, installs
// the seccomp filter and execs the program, so the program is pid 1 of its
// PID namespace and killing it kills the whole tree.
//
// Restore builds a sandbox around a process tree that a snapshot engine
// recreates (it never runs the engine itself: the caller does, through the
// RestoreEnv it is given, which starts the engine inside the new cgroups).
//
// This package owns the instance cgroups under Config.CgroupName, the
// mount point, /dev skeleton and restore roots under Config.StateDir, and
// one tmpfs directory in /dev/shm for the engine's /run (see execPrefix),
// and nothing else: it does not touch
// other cgroups or the host's network. (On cgroup v2 it may move the worker
// itself into a leaf cgroup so that the worker's cgroup can delegate; see
// Config.CgroupName.)
package sandbox
