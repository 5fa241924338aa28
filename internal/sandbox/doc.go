// Package sandbox isolates function instances on one worker.
//
// An instance is a process tree that runs as a non-root uid dedicated to its
// function, in new mount, PID, IPC, UTS and network namespaces (the network
// namespace has only loopback unless Spec.HostNetwork), on a read-only root built from the host's /usr
// and /etc, with its code read-only at /var/task, a private size-limited /tmp,
// and a cgroup (v1 or v2, detected at start) that enforces its memory limit,
// CPU share and pids limit.
//
// The Manager runs in the worker as root. Start re-executes a binary (by
// default the worker's own, /proc/self/exe) as the in-sandbox init: that
// binary must call IsInit and InitMain first thing in main, before anything
// else runs. The init receives its instructions as JSON on a pipe, builds the
// sandbox from inside the new namespaces, drops every privilege and execs the
// instance's program, so the program is pid 1 of its PID namespace and killing
// it kills the whole tree.
//
// This package owns the instance cgroups under Config.CgroupName and
// Config.StateDir, and nothing else: it does not touch other cgroups or the
// host's network. (On cgroup v2 it may move the worker itself into a leaf cgroup
// so that the worker's cgroup can delegate; see Config.CgroupName.)
package sandbox
