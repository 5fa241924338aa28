package codezip

import (
	"archive/zip"
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// writeTree creates files (path -> body; a body starting with "->" makes a
// symlink, a path ending in / a directory, a body starting with "#!" an
// executable) under a new temp dir.
func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, body := range files {
		full := filepath.Join(root, filepath.FromSlash(p))
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case strings.HasPrefix(body, "->"):
			err = os.Symlink(strings.TrimPrefix(body, "->"), full)
		case strings.HasPrefix(body, "#!"):
			err = os.WriteFile(full, []byte(body), 0o755)
		default:
			err = os.WriteFile(full, []byte(body), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestZipDirRoundTrip(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("symlinks")
	}
	src := writeTree(t, map[string]string{
		"app.py":          "def handler(e, c):\n    return e\n",
		"pkg/__init__.py": "",
		"pkg/util.py":     "X = 1\n",
		"bin/run":         "#!/bin/sh\n",
		"empty/":          "",
		"lib":             "->pkg",
		"pkg/up.py":       "->../app.py",
	})
	z, err := ZipDir(src)
	if err != nil {
		t.Fatal(err)
	}
	info, err := Validate(z)
	if err != nil {
		t.Fatal(err)
	}
	if info.Files != 4 || info.Symlinks != 2 || info.Dirs != 3 {
		t.Errorf("info %+v", info)
	}

	// Deterministic: the same tree gives the same bytes, whatever the mtimes.
	later := time.Now().Add(time.Hour)
	os.Chtimes(filepath.Join(src, "app.py"), later, later)
	z2, err := ZipDir(src)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(z, z2) {
		t.Errorf("two zips of the same tree differ")
	}

	// Entries are in lexical order, links stored as links.
	zr, _ := zip.NewReader(bytes.NewReader(z), int64(len(z)))
	var names []string
	for _, f := range zr.File {
		names = append(names, f.Name)
		if f.Name == "lib" && f.Mode()&fs.ModeSymlink == 0 {
			t.Errorf("lib stored as %v, not a symlink", f.Mode())
		}
		if f.Name == "bin/run" && f.Mode().Perm() != 0o755 {
			t.Errorf("bin/run mode %v", f.Mode())
		}
	}
	want := "app.py bin/ bin/run empty/ lib pkg/ pkg/__init__.py pkg/up.py pkg/util.py"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("entries %q, want %q", got, want)
	}

	if runtime.GOOS == "windows" {
		return
	}
	dst := filepath.Join(t.TempDir(), "out")
	if err := Extract(context.Background(), z, dst); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "lib", "up.py")); err != nil || !strings.HasPrefix(string(b), "def handler") {
		t.Errorf("round trip through links: %q %v", b, err)
	}
}

func TestZipDirRejects(t *testing.T) {
	outside := t.TempDir()
	tests := []struct {
		name  string
		files map[string]string
		msg   string
	}{
		{"link outside", map[string]string{"app.py": "", "secrets": "->../../etc/passwd"}, "secrets -> ../../etc/passwd is pointing outside the code directory"},
		{"absolute link", map[string]string{"app.py": "", "etc": "->/etc"}, "etc -> /etc is absolute"},
		{"absolute link to inside", map[string]string{"app.py": "", "self": "->" + outside}, "is absolute"},
		{"chain outside", map[string]string{"x/y": "->..", "z": "->x/y/.."}, "z -> x/y/.. is pointing outside"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ZipDir(writeTree(t, tc.files))
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want one containing %q", err, tc.msg)
			}
		})
	}
}

func TestZipDirArgs(t *testing.T) {
	src := writeTree(t, map[string]string{"app.py": "x"})
	// A symlink to the code directory is followed.
	viaLink := filepath.Join(t.TempDir(), "code")
	if err := os.Symlink(src, viaLink); err != nil {
		t.Fatal(err)
	}
	z, err := ZipDir(viaLink)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := Validate(z); err != nil || info.Files != 1 {
		t.Errorf("info %+v %v", info, err)
	}
	if _, err := ZipDir(filepath.Join(src, "app.py")); !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a file: %v", err)
	}
	if _, err := ZipDir(filepath.Join(src, "nope")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing dir: %v", err)
	}
}

func TestFromFiles(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
	}{
		{"one file", map[string]string{"app.py": "def handler(e, c):\n    return e\n"}},
		{"nested and empty", map[string]string{"pkg/mod.py": "x = 1\n", "app.py": "", "b/c/d.txt": "deep"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := FromFiles(tt.files)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := FromFiles(tt.files)
			if !bytes.Equal(a, b) {
				t.Error("two packings of the same files differ")
			}
			if _, err := Validate(a); err != nil {
				t.Fatalf("Validate: %v", err)
			}
			dir := filepath.Join(t.TempDir(), "code")
			if err := Extract(context.Background(), a, dir); err != nil {
				t.Fatalf("Extract: %v", err)
			}
			for name, want := range tt.files {
				got, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(name)))
				if err != nil || string(got) != want {
					t.Errorf("%s = %q, %v; want %q", name, got, err, want)
				}
			}
		})
	}
}
