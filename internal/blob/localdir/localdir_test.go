package localdir

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/blob/blobtest"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// newDir is the suite's store: a fresh directory, checked when the subtest
// ends for leftover temp files and for files outside the key layout.
func newDir(t *testing.T) blob.Store {
	d, err := New(t.TempDir())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ents, err := os.ReadDir(d.tmp)
		if err != nil {
			t.Errorf("read temp dir: %v", err)
		}
		for _, e := range ents {
			t.Errorf("temp file %s left behind", e.Name())
		}
	})
	return d
}

func TestConformance(t *testing.T) {
	blobtest.Run(t, newDir)
}

func TestNewRemovesOnlyStaleTempFiles(t *testing.T) {
	root := t.TempDir()
	if _, err := New(root); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(root, tmpName)
	for _, tc := range []struct {
		name string
		age  time.Duration
		kept bool
	}{
		{"put-fresh", time.Minute, true},
		{"put-recent", StaleAfter - time.Minute, true},
		{"put-stale", StaleAfter + time.Minute, false},
		{"put-ancient", 30 * 24 * time.Hour, false},
	} {
		p := filepath.Join(tmp, tc.name)
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
		mt := time.Now().Add(-tc.age)
		if err := os.Chtimes(p, mt, mt); err != nil {
			t.Fatal(err)
		}
		defer func() {
			_, err := os.Stat(p)
			if kept := err == nil; kept != tc.kept {
				t.Errorf("%s (%s old): kept = %v, want %v", tc.name, tc.age, kept, tc.kept)
			}
		}()
	}
	if _, err := New(root); err != nil {
		t.Fatal(err)
	}
}

func TestListSkipsTempAndForeignFiles(t *testing.T) {
	ctx := testenv.Ctx(t)
	d, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Put(ctx, "a/b", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{".tmp/put-123", "a/has space", "a/sub dir/x"} {
		full := filepath.Join(d.Root(), filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte("foreign"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(d.Root(), "a", "link")); err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{"", "a", "a/", ".tmp/"} {
		list, err := d.List(ctx, prefix)
		if err != nil {
			t.Fatalf("List(%q): %v", prefix, err)
		}
		want := 1
		if prefix == ".tmp/" {
			want = 0
		}
		if len(list) != want || want == 1 && list[0].Key != "a/b" {
			t.Errorf("List(%q) = %+v, want only a/b", prefix, list)
		}
	}
	os.RemoveAll(filepath.Join(d.Root(), tmpName, "put-123"))
}

func TestReservedTempKey(t *testing.T) {
	ctx := testenv.Ctx(t)
	d, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{".tmp", ".tmp/x", ".tmp/put-1/y"} {
		_, err := d.Put(ctx, key, strings.NewReader("x"), 1)
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Put %s: %v, want ErrInvalid", key, err)
		}
	}
	for _, key := range []string{".tmpx", "a/.tmp", ".tm"} {
		if _, err := d.Put(ctx, key, strings.NewReader("x"), 1); err != nil {
			t.Errorf("Put %s: %v, want it stored", key, err)
		}
	}
}

func TestDeletePrunesEmptyDirs(t *testing.T) {
	ctx := context.Background()
	d, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"x/y/z/obj", "x/keep"} {
		if _, err := d.Put(ctx, key, strings.NewReader("x"), 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Delete(ctx, "x/y/z/obj"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(d.Root(), "x", "y")); !os.IsNotExist(err) {
		t.Errorf("x/y still there after its last object went: %v", err)
	}
	if _, err := os.Stat(filepath.Join(d.Root(), "x", "keep")); err != nil {
		t.Errorf("x/keep: %v", err)
	}
	if _, err := os.Stat(d.Root()); err != nil {
		t.Errorf("root: %v", err)
	}
}

func TestObjectsArePrivate(t *testing.T) {
	d, err := New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Put(context.Background(), "s/img", strings.NewReader("secret"), -1); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(d.Root(), "s", "img"))
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		t.Errorf("object mode %v, want no group or other access", perm)
	}
}
