//go:build unix

package codezip

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Extract unpacks zipBytes into dir, which must not exist yet (its parent
// is created if needed). It applies
// Validate's checks (counting decompressed bytes as it writes), makes
// directories 0755 and files 0644, or 0755 when the zip marks them
// executable, and recreates symlinks as symlinks.
//
// Nothing on disk is trusted either: every directory is opened with
// O_NOFOLLOW relative to its already-open parent and every file is created
// with O_CREAT|O_EXCL|O_NOFOLLOW, so no symlink, planted or extracted, is
// ever followed while writing. The tree is built in a fresh sibling
// directory (dir + ".tmp-XXXX") and renamed into place only when
// complete: dir either does not exist or holds the whole code.
func Extract(ctx context.Context, zipBytes []byte, dir string) error {
	return extract(ctx, zipBytes, dir, defaultLimits)
}

func extract(ctx context.Context, zipBytes []byte, dir string, lim limits) (err error) {
	entries, err := scan(zipBytes, lim)
	if err != nil {
		return err
	}
	dir = filepath.Clean(dir)
	if _, err := os.Lstat(dir); err == nil {
		return fmt.Errorf("extract code to %s: it already exists: remove it or pick a new directory: %w", dir, errdefs.ErrConflict)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("extract code to %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(dir), filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("extract code to %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	root, err := unix.Open(tmp, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("extract code to %s: open %s: %w", dir, tmp, err)
	}
	defer unix.Close(root)
	if err := unix.Fchmod(root, 0o755); err != nil {
		return fmt.Errorf("extract code to %s: chmod %s: %w", dir, tmp, err)
	}

	budget := lim.maxBytes
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("extract code to %s: %w", dir, err)
		}
		if err := writeEntry(ctx, root, e, &budget, lim); err != nil {
			if errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrTooLarge) {
				return err
			}
			return fmt.Errorf("extract code to %s: %w", dir, err)
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return fmt.Errorf("extract code to %s: move the extracted tree into place: %w", dir, err)
	}
	return nil
}

// writeEntry creates one entry below the directory open as root.
func writeEntry(ctx context.Context, root int, e entry, budget *int64, lim limits) error {
	parent, base, err := openParent(root, e.name)
	if err != nil {
		return err
	}
	if parent != root {
		defer unix.Close(parent)
	}
	switch e.kind {
	case kindDir:
		fd, err := mkdirOpen(parent, base)
		if err != nil {
			return fmt.Errorf("create directory %q: %w", e.name, err)
		}
		return unix.Close(fd)
	case kindSymlink:
		if *budget -= int64(len(e.target)); *budget < 0 {
			return errdefs.TooLarge(fmt.Sprintf("code unzips to more than %d MB (the limit was reached at entry %q): leave out what the function does not need", lim.maxBytes>>20, e.f.Name))
		}
		if err := unix.Symlinkat(e.target, parent, base); err != nil {
			return fmt.Errorf("create symlink %q: %w", e.name, err)
		}
		return nil
	}
	mode := uint32(0o644)
	if e.exec {
		mode = 0o755
	}
	fd, err := unix.Openat(parent, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create file %q: %w", e.name, err)
	}
	f := os.NewFile(uintptr(fd), e.name)
	defer f.Close()
	if err := copyEntry(ctx, f, e, budget, lim); err != nil {
		return err
	}
	// Set the mode after writing, through the fd, so the umask cannot change it.
	if err := f.Chmod(os.FileMode(mode)); err != nil {
		return fmt.Errorf("chmod %q: %w", e.name, err)
	}
	return f.Close()
}

// openParent opens (creating as needed) every directory above name,
// starting from root and never following a symlink. It returns the fd of
// the last directory (root itself for a top-level name) and the base name.
func openParent(root int, name string) (fd int, base string, err error) {
	parts := strings.Split(name, "/")
	fd = root
	for _, c := range parts[:len(parts)-1] {
		next, err := mkdirOpen(fd, c)
		if fd != root {
			unix.Close(fd)
		}
		if err != nil {
			return 0, "", fmt.Errorf("create directory for %q: %w", name, err)
		}
		fd = next
	}
	return fd, parts[len(parts)-1], nil
}

// mkdirOpen creates directory name below dirfd if needed and opens it
// without following a symlink, leaving it 0755.
func mkdirOpen(dirfd int, name string) (int, error) {
	if err := unix.Mkdirat(dirfd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
		return 0, err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	if err := unix.Fchmod(fd, 0o755); err != nil {
		unix.Close(fd)
		return 0, err
	}
	return fd, nil
}
