// Package localdir is the blob store of one node: a directory (by default
// $TORPOR_HOME/blobs) in which each object is a file and each "/" in a key a
// subdirectory. It owns everything under its root, including the .tmp
// directory where Puts are written before they are renamed into place (so
// keys may not begin with ".tmp"); it must not be shared with anything that
// writes other files there.
//
// Durability and atomicity come from the usual file-system recipe: write a
// temporary file on the same file system, fsync it, rename it over the
// object, fsync the directory. A Put that fails or whose process dies leaves
// at most a temporary file, which no reader sees and which New removes once
// it is an hour old.
package localdir

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// tmpName is the directory under the root that holds Puts in progress. Keys
// cannot name it (see checkKey), so an object never collides with it.
const tmpName = ".tmp"

// StaleAfter is how old a temporary file must be before New removes it. A
// Put of a large snapshot image can take minutes, and another process may
// share the root, so New removes only what no live Put can still own.
const StaleAfter = time.Hour

// dirPerm and filePerm keep objects private to torpor's user: snapshot
// images hold the memory of functions, secrets included.
const (
	dirPerm  = 0o700
	filePerm = 0o600
)

// copyBufSize is large enough that copying a snapshot image is not
// dominated by system calls.
const copyBufSize = 256 << 10

// Dir is a blob.Store in a local directory. It is safe for concurrent use,
// also by several processes sharing one root.
type Dir struct {
	root string // absolute, cleaned
	tmp  string // root/.tmp
}

var _ blob.Store = (*Dir)(nil)

// New opens (creating if needed) the store rooted at root, and removes the
// temporary files that crashed Puts left behind more than StaleAfter ago.
func New(root string) (*Dir, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("blob dir %s: %w", root, err)
	}
	d := &Dir{root: abs, tmp: filepath.Join(abs, tmpName)}
	if err := os.MkdirAll(d.tmp, dirPerm); err != nil {
		return nil, fmt.Errorf("create blob dir %s: %w", d.tmp, err)
	}
	if err := d.removeStale(time.Now().Add(-StaleAfter)); err != nil {
		return nil, err
	}
	return d, nil
}

// Root returns the absolute directory the store keeps its objects in.
func (d *Dir) Root() string { return d.root }

// removeStale removes the temporary files last written before cutoff. A file
// that vanishes meanwhile was another process's Put finishing or its own
// cleanup; either way it is gone, which is what was wanted.
func (d *Dir) removeStale(cutoff time.Time) error {
	ents, err := os.ReadDir(d.tmp)
	if err != nil {
		return fmt.Errorf("list blob temp dir %s: %w", d.tmp, err)
	}
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil || !fi.ModTime().Before(cutoff) {
			continue
		}
		p := filepath.Join(d.tmp, e.Name())
		if err := os.RemoveAll(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove stale blob temp file %s: %w", p, err)
		}
	}
	return nil
}

// checkKey validates key and refuses the reserved temp directory name as
// its first element.
func checkKey(key string) error {
	if err := blob.ValidateKey(key); err != nil {
		return err
	}
	if key == tmpName || strings.HasPrefix(key, tmpName+"/") {
		return errdefs.Invalid(fmt.Sprintf("blob key %q: the first element %q is reserved by the local store", key, tmpName))
	}
	return nil
}

// path maps a valid key to its file. ValidateKey guarantees that the result
// stays under root: no element is empty, "." or "..", and none holds a
// separator.
func (d *Dir) path(key string) string {
	return filepath.Join(d.root, filepath.FromSlash(key))
}

// Put implements blob.Store.
func (d *Dir) Put(ctx context.Context, key string, r io.Reader, size int64) (blob.Info, error) {
	if err := checkKey(key); err != nil {
		return blob.Info{}, err
	}
	if err := ctx.Err(); err != nil {
		return blob.Info{}, fmt.Errorf("put blob %s: %w", key, err)
	}
	f, err := os.CreateTemp(d.tmp, "put-*")
	if err != nil {
		return blob.Info{}, fmt.Errorf("put blob %s: create temp file in %s: %w", key, d.tmp, err)
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			f.Close()
			os.Remove(tmp)
		}
	}()

	// Hide f's ReadFrom, which would copy through its own 32 KiB buffer.
	n, err := io.CopyBuffer(struct{ io.Writer }{f}, blob.ContextReader(ctx, r), make([]byte, copyBufSize))
	if err != nil {
		return blob.Info{}, fmt.Errorf("put blob %s: after %d bytes: %w", key, n, err)
	}
	if size >= 0 && n != size {
		return blob.Info{}, errdefs.Invalid(fmt.Sprintf("put blob %s: the stream held %d bytes but its size was given as %d", key, n, size))
	}
	if err := f.Sync(); err != nil {
		return blob.Info{}, fmt.Errorf("put blob %s: fsync %s: %w", key, tmp, err)
	}
	if err := f.Close(); err != nil {
		return blob.Info{}, fmt.Errorf("put blob %s: close %s: %w", key, tmp, err)
	}
	// A last check, so that a Put whose caller gave up while the data was
	// being synced does not appear afterwards.
	if err := ctx.Err(); err != nil {
		return blob.Info{}, fmt.Errorf("put blob %s: %w", key, err)
	}
	dst := d.path(key)
	if err := d.rename(tmp, dst); err != nil {
		return blob.Info{}, fmt.Errorf("put blob %s: %w", key, err)
	}
	done = true
	// Make the rename itself durable. New parent directories are not
	// synced into their own parents: a crash may then lose the object, but
	// never expose a partial one.
	if err := syncDir(filepath.Dir(dst)); err != nil {
		return blob.Info{}, fmt.Errorf("put blob %s: %w", key, err)
	}
	fi, err := os.Stat(dst)
	if err != nil {
		return blob.Info{}, fmt.Errorf("put blob %s: %w", key, err)
	}
	return blob.Info{Key: key, Size: n, ModTime: fi.ModTime()}, nil
}

// maxRenameAttempts bounds the retries of rename when a concurrent Delete
// keeps removing the parent directory that rename has just created.
const maxRenameAttempts = 10

// rename moves the finished temporary file tmp to dst, creating dst's
// parent directories. A Delete of the last object in a directory removes
// the directory, possibly between MkdirAll and Rename; then it tries again.
func (d *Dir) rename(tmp, dst string) error {
	dir := filepath.Dir(dst)
	for attempt := 1; ; attempt++ {
		err := os.MkdirAll(dir, dirPerm)
		if err == nil {
			err = os.Rename(tmp, dst)
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, syscall.EEXIST) && !fileOnPath(dir) && attempt < maxRenameAttempts:
			// MkdirAll's mkdir found a directory that a concurrent
			// Delete removed before MkdirAll could check it: try again.
			continue
		case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EEXIST):
			// MkdirAll met a file where a directory must be.
			return fmt.Errorf("%w: another object's key is a parent path of this one (%v)", errdefs.ErrConflict, err)
		case errors.Is(err, syscall.EISDIR):
			return fmt.Errorf("%w: this key is a parent path of other objects' keys (%v)", errdefs.ErrConflict, err)
		case errors.Is(err, fs.ErrNotExist) && attempt < maxRenameAttempts:
			continue
		default:
			return err
		}
	}
}

// fileOnPath reports whether dir or one of its parents is something other
// than a directory (an object whose key is a parent path of dir's).
func fileOnPath(dir string) bool {
	for p := dir; ; p = filepath.Dir(p) {
		if fi, err := os.Lstat(p); err == nil && !fi.IsDir() {
			return true
		}
		if parent := filepath.Dir(p); parent == p {
			return false
		}
	}
}

// syncDir fsyncs a directory, making the entries renamed into it durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %s for fsync: %w", dir, err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// open opens key's file, mapping every way it can be absent (no file, a
// directory in its place, a file where a parent directory should be) to a
// NotFound error.
func (d *Dir) open(ctx context.Context, op, key string) (*os.File, fs.FileInfo, error) {
	if err := checkKey(key); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, fmt.Errorf("%s blob %s: %w", op, key, err)
	}
	f, err := os.Open(d.path(key))
	if err != nil {
		if isAbsent(err) {
			return nil, nil, notFound(key)
		}
		return nil, nil, fmt.Errorf("%s blob %s: %w", op, key, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s blob %s: %w", op, key, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, notFound(key)
	}
	return f, fi, nil
}

func isAbsent(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)
}

func notFound(key string) error {
	return errdefs.NotFound(fmt.Sprintf("blob %s not found", key))
}

// Get implements blob.Store.
func (d *Dir) Get(ctx context.Context, key string) (io.ReadCloser, blob.Info, error) {
	f, fi, err := d.open(ctx, "get", key)
	if err != nil {
		return nil, blob.Info{}, err
	}
	return f, blob.Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// GetRange implements blob.Store.
func (d *Dir) GetRange(ctx context.Context, key string, offset, length int64) (io.ReadCloser, error) {
	f, fi, err := d.open(ctx, "get", key)
	if err != nil {
		return nil, err
	}
	n, err := blob.CheckRange(key, offset, length, fi.Size())
	if err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("get blob %s: seek to %d: %w", key, offset, err)
	}
	return limitedFile{Reader: io.LimitReader(f, n), Closer: f}, nil
}

// limitedFile reads a range of a file and closes the file.
type limitedFile struct {
	io.Reader
	io.Closer
}

// Stat implements blob.Store.
func (d *Dir) Stat(ctx context.Context, key string) (blob.Info, error) {
	if err := checkKey(key); err != nil {
		return blob.Info{}, err
	}
	if err := ctx.Err(); err != nil {
		return blob.Info{}, fmt.Errorf("stat blob %s: %w", key, err)
	}
	fi, err := os.Stat(d.path(key))
	if err != nil {
		if isAbsent(err) {
			return blob.Info{}, notFound(key)
		}
		return blob.Info{}, fmt.Errorf("stat blob %s: %w", key, err)
	}
	if !fi.Mode().IsRegular() {
		return blob.Info{}, notFound(key)
	}
	return blob.Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}, nil
}

// Delete implements blob.Store. It also removes the parent directories the
// object leaves empty, so that deleted snapshots leave no trace; a Put
// racing to reuse such a directory recreates it (see rename).
func (d *Dir) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("delete blob %s: %w", key, err)
	}
	p := d.path(key)
	fi, err := os.Lstat(p)
	if err != nil {
		if isAbsent(err) {
			return nil
		}
		return fmt.Errorf("delete blob %s: %w", key, err)
	}
	if fi.IsDir() {
		return nil // a parent path of other keys, not an object
	}
	if err := os.Remove(p); err != nil && !isAbsent(err) {
		return fmt.Errorf("delete blob %s: %w", key, err)
	}
	for dir := filepath.Dir(p); dir != d.root && strings.HasPrefix(dir, d.root); dir = filepath.Dir(dir) {
		if os.Remove(dir) != nil {
			break // not empty (or already gone): the ones above are not empty either
		}
	}
	return nil
}

// List implements blob.Store. It walks only the directory the prefix's
// complete elements name, and skips the temp directory and any file whose
// name could not be a key (put there by something else).
func (d *Dir) List(ctx context.Context, prefix string) ([]blob.Info, error) {
	if err := blob.ValidatePrefix(prefix); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("list blobs %q: %w", prefix, err)
	}
	start := d.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = d.path(prefix[:i])
	}
	var out []blob.Info
	err := filepath.WalkDir(start, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if isAbsent(err) {
				return nil // deleted while we walked, or no such prefix directory
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == d.root {
			return nil
		}
		rel, err := filepath.Rel(d.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if e.IsDir() {
			if key == tmpName || !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/") {
				return fs.SkipDir
			}
			return nil
		}
		if !e.Type().IsRegular() || !strings.HasPrefix(key, prefix) || checkKey(key) != nil {
			return nil
		}
		fi, err := e.Info()
		if err != nil {
			if isAbsent(err) {
				return nil
			}
			return err
		}
		out = append(out, blob.Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list blobs %q in %s: %w", prefix, d.root, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
