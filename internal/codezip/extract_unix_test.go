//go:build unix

package codezip

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

func TestExtract(t *testing.T) {
	z := mkzip(t,
		file("app.py", "def handler(e, c):\n    return e\n"),
		dir("pkg/"),
		file("pkg/__init__.py", ""),
		file("deep/er/mod.py", "x = 1\n"), // parents without dir entries
		exe("bin/run", "#!/bin/sh\necho hi\n"),
		link("lib", "pkg"),
		link("pkg/app_link.py", "../app.py"),
		dir("empty/"),
	)
	// A umask that would strip the group and other bits must not matter.
	old := unix.Umask(0o077)
	defer unix.Umask(old)

	dst := filepath.Join(t.TempDir(), "code", "sha256") // the parent is created
	if err := Extract(context.Background(), z, dst); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path   string
		mode   fs.FileMode
		body   string // for files
		target string // for links
	}{
		{"", fs.ModeDir | 0o755, "", ""},
		{"app.py", 0o644, "def handler(e, c):\n    return e\n", ""},
		{"pkg", fs.ModeDir | 0o755, "", ""},
		{"pkg/__init__.py", 0o644, "", ""},
		{"deep", fs.ModeDir | 0o755, "", ""},
		{"deep/er", fs.ModeDir | 0o755, "", ""},
		{"deep/er/mod.py", 0o644, "x = 1\n", ""},
		{"bin/run", 0o755, "#!/bin/sh\necho hi\n", ""},
		{"lib", fs.ModeSymlink, "", "pkg"},
		{"pkg/app_link.py", fs.ModeSymlink, "", "../app.py"},
		{"empty", fs.ModeDir | 0o755, "", ""},
	}
	for _, tc := range tests {
		p := filepath.Join(dst, tc.path)
		fi, err := os.Lstat(p)
		if err != nil {
			t.Errorf("%s: %v", tc.path, err)
			continue
		}
		if tc.mode&fs.ModeSymlink != 0 {
			if target, _ := os.Readlink(p); fi.Mode()&fs.ModeSymlink == 0 || target != tc.target {
				t.Errorf("%s: mode %v target %q, want a link to %q", tc.path, fi.Mode(), target, tc.target)
			}
			continue
		}
		if fi.Mode() != tc.mode {
			t.Errorf("%s: mode %v, want %v", tc.path, fi.Mode(), tc.mode)
		}
		if fi.Mode().IsRegular() {
			if b, _ := os.ReadFile(p); string(b) != tc.body {
				t.Errorf("%s: body %q, want %q", tc.path, b, tc.body)
			}
		}
	}
	// Links work once extracted.
	if b, err := os.ReadFile(filepath.Join(dst, "lib/app_link.py")); err != nil || !strings.HasPrefix(string(b), "def handler") {
		t.Errorf("through links: %q %v", b, err)
	}
	assertNoTemp(t, filepath.Dir(dst))
}

// assertNoTemp checks that no dir.tmp-* directory was left behind.
func assertNoTemp(t *testing.T, parent string) {
	t.Helper()
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary directory %s left behind", e.Name())
		}
	}
}

func TestExtractRejects(t *testing.T) {
	for _, tc := range maliciousZips(t) {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dst := filepath.Join(parent, "code")
			err := Extract(context.Background(), tc.zip, dst)
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want %v containing %q", err, tc.class, tc.msg)
			}
			if _, err := os.Lstat(dst); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%s exists after a failed extract", dst)
			}
			assertNoTemp(t, parent)
			if _, err := os.Lstat(filepath.Join(parent, "evil.txt")); err == nil {
				t.Errorf("a file escaped the target directory")
			}
		})
	}
}

func TestExtractFailures(t *testing.T) {
	z := mkzip(t, file("a.py", strings.Repeat("x", 60)), file("b.py", strings.Repeat("y", 60)))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name  string
		ctx   context.Context
		lim   limits
		setup func(dst string)
		check func(t *testing.T, err error)
	}{
		{"target exists", context.Background(), defaultLimits, func(dst string) { os.Mkdir(dst, 0o755) }, func(t *testing.T, err error) {
			if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "already exists") {
				t.Errorf("error %v", err)
			}
		}},
		{"bomb over a small limit", context.Background(), limits{maxBytes: 100, maxEntries: 10}, nil, func(t *testing.T, err error) {
			if !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), `"b.py"`) {
				t.Errorf("error %v", err)
			}
		}},
		{"cancelled", cancelled, defaultLimits, nil, func(t *testing.T, err error) {
			if !errors.Is(err, context.Canceled) {
				t.Errorf("error %v", err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			dst := filepath.Join(parent, "code")
			if tc.setup != nil {
				tc.setup(dst)
			}
			err := extract(tc.ctx, z, dst, tc.lim)
			if err == nil {
				t.Fatal("no error")
			}
			tc.check(t, err)
			assertNoTemp(t, parent)
		})
	}
}

// TestWriteEntryNoFollow plants symlinks on disk where entries go and
// checks that writing never follows them: not for a parent directory and
// not for the file itself.
func TestWriteEntryNoFollow(t *testing.T) {
	outside := t.TempDir()
	root := t.TempDir()
	if err := os.Symlink(outside, filepath.Join(root, "evil")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "target.txt"), filepath.Join(root, "planted.txt")); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)

	z := mkzip(t, file("evil/x.txt", "pwned"), file("planted.txt", "pwned"), dir("evil/"))
	entries, err := scan(z, defaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		budget := int64(1 << 20)
		if err := writeEntry(context.Background(), fd, e, &budget, defaultLimits); err == nil {
			t.Errorf("entry %q was written through a planted symlink", e.name)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("files appeared outside the root: %v", ents)
	}
}
