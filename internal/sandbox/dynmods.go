package sandbox

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// favorDynMods sets the cgroup2 superblock option favordynmods (Linux 6.0+)
// on the first cgroup2 mount, unless it is set already, and reports whether
// it is on.
//
// Moving a process into a cgroup takes the kernel's global
// cgroup_threadgroup_rwsem for writing, and without favordynmods every such
// writer first waits out an RCU grace period: on this project's 2-core VMs
// adopting a new function template into its cgroup took 6–30 ms, most of a
// cold start (docs/templates.md). With the option the readers (fork, exit)
// take the slow path instead and a move costs ~20 µs. The rwsem is shared
// by every hierarchy, so setting it on the cgroup2 mount helps the v1
// hierarchies too (systemd's "hybrid" layout mounts cgroup2 at
// /sys/fs/cgroup/unified). It is a host-wide setting and outlives the
// worker; Config.KeepCgroupOptions leaves it alone.
func favorDynMods(mounts []mountInfo) (bool, error) {
	i := slices.IndexFunc(mounts, func(m mountInfo) bool { return m.FSType == "cgroup2" })
	if i < 0 {
		return false, fmt.Errorf("no cgroup2 mount to set favordynmods on")
	}
	m := mounts[i]
	if slices.Contains(m.SuperOpts, "favordynmods") {
		return true, nil
	}
	// fspick + reconfigure changes the superblock's options only, never
	// the mount's own flags (nosuid, nodev, ...), which a classic
	// remount would reset.
	fd, err := unix.Fspick(unix.AT_FDCWD, m.MountPoint, unix.FSPICK_CLOEXEC)
	if err != nil {
		return false, fmt.Errorf("fspick %s: %w", m.MountPoint, err)
	}
	defer unix.Close(fd)
	if err := unix.FsconfigSetFlag(fd, "favordynmods"); err != nil {
		return false, fmt.Errorf("set favordynmods on %s (Linux < 6.0?): %w", m.MountPoint, err)
	}
	if err := unix.FsconfigReconfigure(fd); err != nil {
		return false, fmt.Errorf("reconfigure %s with favordynmods: %w", m.MountPoint, err)
	}
	return true, nil
}
