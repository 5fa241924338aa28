// Package codezip owns the code packages of functions: it validates zip
// archives uploaded by users, extracts them safely onto disk and builds
// them from a directory for the CLI. A code zip is untrusted input, so
// every path here defends against path traversal, symlink escapes and zip
// bombs. It must not import any torpor package but errdefs and function.
package codezip

import (
	"archive/zip"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// MaxEntries bounds the number of entries in a code zip, so that a zip of
// millions of empty files cannot exhaust memory or inodes.
const MaxEntries = 100_000

// maxSymlinkTarget bounds a symlink target (PATH_MAX on Linux).
const maxSymlinkTarget = 4096

// maxSymlinkHops bounds symlink resolution, as the kernel does (MAXSYMLINKS).
const maxSymlinkHops = 40

// Info describes a valid code zip.
type Info struct {
	Files    int   // regular files
	Dirs     int   // explicit directory entries
	Symlinks int   // symlinks, all pointing inside the root
	Size     int64 // total uncompressed bytes, counted while decompressing
}

type kind int

const (
	kindFile kind = iota
	kindDir
	kindSymlink
)

func (k kind) String() string {
	switch k {
	case kindDir:
		return "directory"
	case kindSymlink:
		return "symlink"
	}
	return "file"
}

// entry is one checked zip entry.
type entry struct {
	f      *zip.File
	name   string // cleaned, relative, slash-separated, no trailing slash
	kind   kind
	exec   bool   // regular file with an execute bit
	target string // symlink target
}

// limits are the bounds a zip is checked against; tests shrink them.
type limits struct {
	maxBytes   int64
	maxEntries int
}

var defaultLimits = limits{maxBytes: function.MaxCodeUnzipBytes, maxEntries: MaxEntries}

// Validate checks that zipBytes is a zip that Extract will accept: no
// absolute paths, no ".." components, no symlinks leaving the root, no
// special files, and at most function.MaxCodeUnzipBytes once decompressed
// (measured by decompressing, not by trusting the headers). Errors are
// errdefs.ErrInvalid or errdefs.ErrTooLarge and name the offending entry.
func Validate(zipBytes []byte) (Info, error) {
	return validate(zipBytes, defaultLimits)
}

func validate(zipBytes []byte, lim limits) (Info, error) {
	entries, err := scan(zipBytes, lim)
	if err != nil {
		return Info{}, err
	}
	var info Info
	budget := lim.maxBytes
	for _, e := range entries {
		switch e.kind {
		case kindDir:
			info.Dirs++
		case kindSymlink:
			info.Symlinks++
			budget -= int64(len(e.target))
		case kindFile:
			info.Files++
			if err := copyEntry(context.Background(), io.Discard, e, &budget, lim); err != nil {
				return Info{}, err
			}
		}
	}
	info.Size = lim.maxBytes - budget
	return info, nil
}

// scan opens the zip and checks every entry's name, type and place in the
// tree, and every symlink's target. It reads symlink targets but no file
// data.
func scan(zipBytes []byte, lim limits) ([]entry, error) {
	zr, err := zip.NewReader(bytes.NewReader(zipBytes), int64(len(zipBytes)))
	// ErrInsecurePath (GODEBUG=zipinsecurepath=0) still returns a reader;
	// the checks below are stricter than it.
	if err != nil && !errors.Is(err, zip.ErrInsecurePath) {
		return nil, errdefs.Invalid(fmt.Sprintf("code is not a valid zip archive (%v): upload a .zip file, e.g. made with `zip -r code.zip .` or `torpor deploy --code DIR`", err))
	}
	if len(zr.File) > lim.maxEntries {
		return nil, errdefs.TooLarge(fmt.Sprintf("code zip has %d entries: the limit is %d, leave out what the function does not need", len(zr.File), lim.maxEntries))
	}
	var entries []entry
	kinds := map[string]kind{}
	links := map[string]string{}
	for i, f := range zr.File {
		e, skip, err := checkEntry(i, f)
		if err != nil {
			return nil, err
		}
		if skip {
			continue
		}
		if k, dup := kinds[e.name]; dup {
			if k == kindDir && e.kind == kindDir {
				continue
			}
			return nil, errdefs.Invalid(fmt.Sprintf("code zip entry %q appears twice (as %s and %s): re-create the zip so that each path appears once", f.Name, k, e.kind))
		}
		if e.kind == kindSymlink {
			if e.target, err = readTarget(f); err != nil {
				return nil, err
			}
			links[e.name] = e.target
		}
		kinds[e.name] = e.kind
		entries = append(entries, e)
	}
	// A path may only sit below directories: below a file it cannot be
	// created, and below a symlink it would be written through the link.
	for _, e := range entries {
		for p := path.Dir(e.name); p != "."; p = path.Dir(p) {
			if k, ok := kinds[p]; ok && k != kindDir {
				return nil, errdefs.Invalid(fmt.Sprintf("code zip entry %q lies inside %q, which is a %s: re-create the zip without one of them", e.f.Name, p, k))
			}
		}
	}
	for _, e := range entries {
		if e.kind == kindSymlink {
			if err := checkLink(links, e.name, e.target); err != nil {
				return nil, err
			}
		}
	}
	return entries, nil
}

// checkEntry checks one entry's name and type. skip reports an entry that
// names the root itself ("./").
func checkEntry(i int, f *zip.File) (e entry, skip bool, err error) {
	name := f.Name
	switch {
	case name == "":
		return e, false, errdefs.Invalid(fmt.Sprintf("code zip entry #%d has an empty name: re-create the zip", i+1))
	case strings.ContainsRune(name, 0):
		return e, false, errdefs.Invalid(fmt.Sprintf("code zip entry %q contains a NUL byte: re-create the zip", name))
	case strings.ContainsRune(name, '\\'):
		return e, false, errdefs.Invalid(fmt.Sprintf("code zip entry %q contains a backslash: re-create the zip with a tool that writes '/' separators (zip, 7z, or torpor deploy --code DIR)", name))
	case strings.HasPrefix(name, "/") || (len(name) >= 2 && name[1] == ':'):
		return e, false, errdefs.Invalid(fmt.Sprintf("code zip entry %q has an absolute path: re-create the zip with paths relative to the code root", name))
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return e, false, errdefs.Invalid(fmt.Sprintf("code zip entry %q contains a '..' component: re-create the zip with every path inside the code root", name))
		}
	}
	e = entry{f: f, name: path.Clean(name)}
	if e.name == "." {
		return e, true, nil
	}
	mode := f.Mode()
	switch {
	case mode&fs.ModeSymlink != 0:
		e.kind = kindSymlink
		if strings.HasSuffix(name, "/") {
			return e, false, errdefs.Invalid(fmt.Sprintf("code zip entry %q is a symlink with a directory name: re-create the zip", name))
		}
	case mode.IsDir() || strings.HasSuffix(name, "/"):
		e.kind = kindDir
	case mode.IsRegular():
		e.kind = kindFile
		e.exec = mode&0o111 != 0
	default:
		return e, false, errdefs.Invalid(fmt.Sprintf("code zip entry %q is a special file (%v): keep only regular files, directories and symlinks", name, mode.Type()))
	}
	return e, false, nil
}

// readTarget reads a symlink entry's target, which zip stores as the
// entry's data.
func readTarget(f *zip.File) (string, error) {
	rc, err := f.Open()
	if err != nil {
		return "", errdefs.Invalid(fmt.Sprintf("code zip entry %q cannot be read (%v): re-create the zip", f.Name, err))
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxSymlinkTarget+1))
	if err != nil {
		return "", errdefs.Invalid(fmt.Sprintf("code zip entry %q is corrupt (%v): re-create the zip", f.Name, err))
	}
	switch {
	case len(b) == 0:
		return "", errdefs.Invalid(fmt.Sprintf("code zip entry %q is a symlink with an empty target: remove it", f.Name))
	case len(b) > maxSymlinkTarget:
		return "", errdefs.Invalid(fmt.Sprintf("code zip entry %q is a symlink with a target over %d bytes: remove it", f.Name, maxSymlinkTarget))
	case bytes.IndexByte(b, 0) >= 0:
		return "", errdefs.Invalid(fmt.Sprintf("code zip entry %q is a symlink whose target contains a NUL byte: remove it", f.Name))
	}
	return string(b), nil
}

// checkLink fails if the symlink entry name -> target leaves the root.
func checkLink(links map[string]string, name, target string) error {
	if why := linkEscape(links, name, target); why != "" {
		return errdefs.Invalid(fmt.Sprintf("code zip entry %q is a symlink to %q, %s: replace the link with a copy of what it points to, or a relative link inside the code root", name, target, why))
	}
	return nil
}

// linkEscape says why the symlink at name (relative to the root) with the
// given target leaves the root, or returns "" if it stays inside. It
// resolves the target the way the kernel would, component by component,
// following the other symlinks in links: checking the target as a string
// is not enough, since "a/b/.." is not "a" when a/b is itself a link.
func linkEscape(links map[string]string, name, target string) string {
	if path.IsAbs(target) {
		return "an absolute path"
	}
	var cur []string // resolved components below the root
	if d := path.Dir(name); d != "." {
		cur = strings.Split(d, "/")
	}
	rest := strings.Split(target, "/")
	hops := 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return "which leaves the code root"
			}
			cur = cur[:len(cur)-1]
			continue
		}
		cur = append(cur, c)
		t, isLink := links[strings.Join(cur, "/")]
		if !isLink {
			continue
		}
		if hops++; hops > maxSymlinkHops {
			return fmt.Sprintf("which loops or goes through more than %d links", maxSymlinkHops)
		}
		if path.IsAbs(t) {
			return fmt.Sprintf("which goes through %q, a link to an absolute path", strings.Join(cur, "/"))
		}
		cur = cur[:len(cur)-1]
		rest = append(strings.Split(t, "/"), rest...)
	}
	return ""
}

// copyEntry decompresses a file entry into w, charging the bytes actually
// produced to budget: the headers' sizes are never trusted.
func copyEntry(ctx context.Context, w io.Writer, e entry, budget *int64, lim limits) error {
	rc, err := e.f.Open()
	if err != nil {
		return errdefs.Invalid(fmt.Sprintf("code zip entry %q cannot be read (%v): re-create the zip", e.f.Name, err))
	}
	defer rc.Close()
	r := &entryReader{ctx: ctx, r: rc}
	n, err := io.Copy(w, io.LimitReader(r, *budget+1))
	*budget -= n
	switch {
	case *budget < 0:
		return errdefs.TooLarge(fmt.Sprintf("code unzips to more than %d MB (the limit was reached at entry %q): leave out what the function does not need, such as tests, caches and docs",
			lim.maxBytes>>20, e.f.Name))
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil && err == r.err:
		// Decompression failed: bad deflate data, a CRC mismatch, or more
		// data than the header declared.
		return errdefs.Invalid(fmt.Sprintf("code zip entry %q is corrupt (%v): re-create the zip", e.f.Name, err))
	case err != nil:
		return fmt.Errorf("write code zip entry %q: %w", e.f.Name, err)
	}
	return nil
}

// entryReader reads a zip entry, stops when ctx is done and remembers a
// read error so that it can be told apart from a write error.
type entryReader struct {
	ctx context.Context
	r   io.Reader
	err error
}

func (r *entryReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		r.err = err
	}
	return n, err
}
