package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// rootfsDir is the directory under Config.StateDir on which each sandbox
// mounts its root tmpfs, in its own mount namespace.
const rootfsDir = "rootfs"

// oldRootDir is where the host root stays reachable, inside the new root,
// between pivot_root and its detachment.
const oldRootDir = "/.oldroot"

// systemDirs are the host directories every sandbox sees read-only. On a
// merged-/usr system the last four are symlinks into /usr and are recreated
// as such.
var systemDirs = []string{"usr", "etc", "lib", "lib64", "bin", "sbin"}

// makeMountPoints creates in root what a sandbox root holds before any
// mount: a directory for each host system directory (returned, as host
// paths, for binding), the host's system symlinks (/bin → usr/bin on a
// merged-/usr system), and directories for /proc, /dev, /tmp and extra.
// The init builds the root tmpfs with it; a restore builds the directory
// CRIU binds as the restored root.
func makeMountPoints(root string, extra ...string) (binds []string, err error) {
	for _, name := range systemDirs {
		host := "/" + name
		fi, err := os.Lstat(host)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil:
			return nil, err
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(host)
			if err != nil {
				return nil, err
			}
			if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
				return nil, err
			}
		case fi.IsDir():
			if err := unix.Mkdir(filepath.Join(root, name), 0o755); err != nil {
				return nil, fmt.Errorf("mkdir %s: %w", host, err)
			}
			binds = append(binds, host)
		}
	}
	for _, d := range append([]string{"proc", "dev", "tmp"}, extra...) {
		if err := unix.Mkdir(filepath.Join(root, d), 0o755); err != nil {
			return nil, fmt.Errorf("mkdir /%s: %w", d, err)
		}
	}
	return binds, nil
}

// devNodes are the character devices of the sandbox's /dev (name, major,
// minor), bound from the host's.
var devNodes = []struct {
	name         string
	major, minor uint32
}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}}

// buildRoot builds the sandbox's filesystem and makes it the process root.
// It runs in the init, in the new mount namespace: it mounts a tmpfs on
// cfg.Root, pivots into it, binds the system directories and cfg.Binds from
// the old root, mounts /proc, /dev and /tmp, detaches the old root and
// makes the root read-only.
func buildRoot(cfg *initConfig) error {
	// Nothing below may propagate back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return step("make mounts private", err)
	}
	root := cfg.Root
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m,nr_inodes=4096"); err != nil {
		return step("mount root tmpfs", fmt.Errorf("%s: %w", root, err))
	}
	binds, err := makeMountPoints(root, oldRootDir[1:])
	if err != nil {
		return step("root mount points", err)
	}

	// Pivot first and bind from the old root afterwards, so that every
	// target path (and any symlink in it) resolves inside the new root.
	if err := unix.PivotRoot(root, filepath.Join(root, oldRootDir)); err != nil {
		return step("pivot_root", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return step("pivot_root", err)
	}
	const ro = unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
	for _, d := range binds {
		if err := bindMount(oldRootDir+d, d, ro); err != nil {
			return step("mount "+d, err)
		}
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return step("mount /proc", err)
	}
	if err := buildDev(cfg.DevDir); err != nil {
		return err
	}
	tmpOpts := fmt.Sprintf("mode=1777,size=%dm", cfg.TmpMB)
	if err := unix.Mount("tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, tmpOpts); err != nil {
		return step("mount /tmp", err)
	}
	if err := unix.Mkdir(shmDir, 0o1777); err != nil {
		return step("mkdir "+shmDir, err)
	}
	for _, b := range cfg.Binds {
		if err := userBind(b); err != nil {
			return step("bind "+b.Target, err)
		}
	}
	if err := unix.Unmount(oldRootDir, unix.MNT_DETACH); err != nil {
		return step("detach old root", err)
	}
	if err := unix.Rmdir(oldRootDir); err != nil {
		return step("detach old root", err)
	}
	if err := setMountAttr("/", unix.MOUNT_ATTR_RDONLY, false); err != nil {
		return step("remount root read-only", err)
	}
	return nil
}

// devSkeletonDir, under the state dir, holds what /dev shows: empty files
// as mount points for the device nodes and the links of devLinks. Bound
// read-only, it keeps /dev out of a snapshot (a tmpfs would be archived on
// every checkpoint and unpacked on every restore, ~4 ms each).
const devSkeletonDir = "dev"

// shmDir is where /dev/shm points: inside the instance's /tmp, so that
// POSIX shared memory and semaphores share its size limit and its
// snapshot, instead of needing a tmpfs of their own (again ~4 ms a restore).
const shmDir = "/tmp/.shm"

// devLinks are /dev's symbolic links.
var devLinks = [][2]string{
	{"fd", "/proc/self/fd"},
	{"stdin", "/proc/self/fd/0"},
	{"stdout", "/proc/self/fd/1"},
	{"stderr", "/proc/self/fd/2"},
	{"shm", shmDir},
}

// makeDevSkeleton (re)creates the /dev skeleton in dir, on the host.
func makeDevSkeleton(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	for _, d := range devNodes {
		if err := os.WriteFile(filepath.Join(dir, d.name), nil, 0o644); err != nil {
			return err
		}
	}
	for _, l := range devLinks {
		if err := os.Symlink(l[1], filepath.Join(dir, l[0])); err != nil {
			return err
		}
	}
	return os.Chmod(dir, 0o755)
}

// buildDev binds the /dev skeleton read-only and the host's harmless
// character devices onto its files (mknod is refused in a user namespace;
// each node is checked to be the expected device, not whatever the host
// has there).
func buildDev(skeleton string) error {
	if err := bindMount(oldRootDir+skeleton, "/dev", unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC|unix.MOUNT_ATTR_NODEV); err != nil {
		return step("mount /dev", err)
	}
	for _, d := range devNodes {
		p := "/dev/" + d.name
		var st unix.Stat_t
		if err := unix.Stat(oldRootDir+p, &st); err != nil {
			return step("stat host "+p, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(d.major, d.minor) {
			return step("bind "+p, fmt.Errorf("host %s is not the character device %d:%d", p, d.major, d.minor))
		}
		if err := unix.Mount(oldRootDir+p, p, "", unix.MS_BIND, ""); err != nil {
			return step("bind "+p, err)
		}
		if err := setMountAttr(p, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC, false); err != nil {
			return step("bind "+p, err)
		}
	}
	return nil
}

// userBind mounts one Spec bind, creating its mount point (and missing
// parents, 0755) inside the new root unless it already exists.
func userBind(b Bind) error {
	src := oldRootDir + b.Source
	var st unix.Stat_t
	if err := unix.Stat(src, &st); err != nil {
		return fmt.Errorf("source %s: %w", b.Source, err)
	}
	isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
	if _, err := os.Lstat(b.Target); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(b.Target), 0o755); err != nil {
			return fmt.Errorf("create mount point: %w", err)
		}
		if isDir {
			err = unix.Mkdir(b.Target, 0o755)
		} else {
			var fd int
			fd, err = unix.Open(b.Target, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
			if err == nil {
				unix.Close(fd)
			}
		}
		if err != nil {
			return fmt.Errorf("create mount point: %w", err)
		}
	}
	attr := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	if !b.Writable {
		attr |= unix.MOUNT_ATTR_RDONLY
	}
	return bindMount(src, b.Target, attr)
}

// bindMount recursively binds src on dst and sets attr on the whole new
// mount tree (so submounts of src are read-only too).
func bindMount(src, dst string, attr uint64) error {
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("mount %s on %s: %w", src, dst, err)
	}
	return setMountAttr(dst, attr, true)
}

// setMountAttr sets mount attributes on the mount at p (and, with
// recursive, every mount below it) with mount_setattr(2), which unlike a
// bind-remount changes a whole tree at once.
func setMountAttr(p string, attr uint64, recursive bool) error {
	flags := uint(0)
	if recursive {
		flags = unix.AT_RECURSIVE
	}
	err := unix.MountSetattr(unix.AT_FDCWD, p, flags, &unix.MountAttr{Attr_set: attr})
	if errors.Is(err, unix.ENOSYS) {
		// Linux < 5.12: a bind-remount, which covers only the top mount.
		mf := uintptr(unix.MS_BIND | unix.MS_REMOUNT)
		for _, m := range [][2]uint64{{unix.MOUNT_ATTR_RDONLY, unix.MS_RDONLY}, {unix.MOUNT_ATTR_NOSUID, unix.MS_NOSUID}, {unix.MOUNT_ATTR_NODEV, unix.MS_NODEV}} {
			if attr&m[0] != 0 {
				mf |= uintptr(m[1])
			}
		}
		err = unix.Mount("", p, "", mf, "")
	}
	if err != nil {
		return fmt.Errorf("set mount attributes of %s: %w", p, err)
	}
	return nil
}
