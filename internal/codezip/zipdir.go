package codezip

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// ZipDir packs the tree under dir into a code zip for deploy. The output
// depends only on the tree's names, contents, exec bits and links: entries
// are in lexical order and carry no timestamps, so the same tree always
// gives the same bytes (and the same code digest). Symlinks that resolve
// inside dir are stored as symlinks; one that points outside (or to an
// absolute path) is an error naming it, since it would dangle on a worker.
func ZipDir(dir string) ([]byte, error) {
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil, fmt.Errorf("zip %s: %w", dir, err)
	}
	if fi, err := os.Stat(root); err != nil {
		return nil, fmt.Errorf("zip %s: %w", dir, err)
	} else if !fi.IsDir() {
		return nil, errdefs.Invalid(fmt.Sprintf("zip %s: not a directory: pass the directory holding the code, or a .zip file", dir))
	}

	type item struct {
		rel, abs string
		d        fs.DirEntry
		target   string
	}
	var items []item
	links := map[string]string{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		it := item{rel: filepath.ToSlash(rel), abs: p, d: d}
		switch t := d.Type(); {
		case t&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			it.target = filepath.ToSlash(target)
			links[it.rel] = it.target
		case d.IsDir(), t.IsRegular():
		default:
			return errdefs.Invalid(fmt.Sprintf("%s is a special file (%v): code may hold only files, directories and symlinks, remove it", p, t))
		}
		items = append(items, it)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("zip %s: %w", dir, err)
	}
	for _, it := range items {
		if it.d.Type()&fs.ModeSymlink == 0 {
			continue
		}
		if why := linkEscape(links, it.rel, it.target); why != "" {
			return nil, errdefs.Invalid(fmt.Sprintf("symlink %s -> %s is %s: it would dangle where the function runs; replace it with a copy of its target or a relative link inside %s",
				it.abs, it.target, whyLink(why), dir))
		}
	}

	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var total int64
	for _, it := range items {
		hdr := &zip.FileHeader{Name: it.rel, Method: zip.Store}
		switch {
		case it.d.Type()&fs.ModeSymlink != 0:
			hdr.SetMode(fs.ModeSymlink | 0o777)
			w, err := zw.CreateHeader(hdr)
			if err != nil {
				return nil, fmt.Errorf("zip %s: %w", it.abs, err)
			}
			if _, err := io.WriteString(w, it.target); err != nil {
				return nil, fmt.Errorf("zip %s: %w", it.abs, err)
			}
			total += int64(len(it.target))
		case it.d.IsDir():
			hdr.Name += "/"
			hdr.SetMode(fs.ModeDir | 0o755)
			if _, err := zw.CreateHeader(hdr); err != nil {
				return nil, fmt.Errorf("zip %s: %w", it.abs, err)
			}
		default:
			n, err := addFile(zw, hdr, it.abs, function.MaxCodeUnzipBytes-total)
			total += n
			if err != nil {
				return nil, err
			}
		}
		if total > function.MaxCodeUnzipBytes {
			return nil, errdefs.TooLarge(fmt.Sprintf("%s holds more than %d MB (reached at %s): the unzipped code limit is %d MB, leave out what the function does not need",
				dir, function.MaxCodeUnzipBytes>>20, it.rel, function.MaxCodeUnzipBytes>>20))
		}
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("zip %s: %w", dir, err)
	}
	if buf.Len() > function.MaxCodeZipBytes {
		return nil, errdefs.TooLarge(fmt.Sprintf("%s zips to %d MB: the code zip limit is %d MB, leave out what the function does not need",
			dir, buf.Len()>>20, function.MaxCodeZipBytes>>20))
	}
	return buf.Bytes(), nil
}

// addFile deflates the regular file at abs into zw, reading at most
// limit+1 bytes; it returns the bytes read.
func addFile(zw *zip.Writer, hdr *zip.FileHeader, abs string, limit int64) (int64, error) {
	f, err := os.Open(abs)
	if err != nil {
		return 0, fmt.Errorf("zip %s: %w", abs, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("zip %s: %w", abs, err)
	}
	mode := fs.FileMode(0o644)
	if fi.Mode()&0o111 != 0 {
		mode = 0o755
	}
	hdr.Method = zip.Deflate
	hdr.SetMode(mode)
	w, err := zw.CreateHeader(hdr)
	if err != nil {
		return 0, fmt.Errorf("zip %s: %w", abs, err)
	}
	n, err := io.Copy(w, io.LimitReader(f, limit+1))
	if err != nil {
		return n, fmt.Errorf("zip %s: %w", abs, err)
	}
	return n, nil
}

// whyLink turns linkEscape's reason into the tail of "symlink X -> Y is ...".
func whyLink(why string) string {
	switch why {
	case "an absolute path":
		return "absolute"
	case "which leaves the code root":
		return "pointing outside the code directory"
	}
	return "unusable (" + why + ")"
}

// FromFiles packs in-memory files (name → content, slash-separated names)
// into a code zip, deterministically like ZipDir: sorted, no timestamps.
func FromFiles(files map[string]string) ([]byte, error) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		hdr := &zip.FileHeader{Name: name, Method: zip.Deflate}
		hdr.SetMode(0o644)
		w, err := zw.CreateHeader(hdr)
		if err != nil {
			return nil, fmt.Errorf("zip %s: %w", name, err)
		}
		if _, err := io.WriteString(w, files[name]); err != nil {
			return nil, fmt.Errorf("zip %s: %w", name, err)
		}
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("zip: %w", err)
	}
	return buf.Bytes(), nil
}
