package archive

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// FuzzExtract feeds arbitrary streams to Extract: it must never panic,
// never create anything outside its directory, leave the directory empty
// when it fails, and create only regular files with valid names and safe
// modes when it succeeds.
func FuzzExtract(f *testing.F) {
	seeds := [][]byte{
		oneFile().trailer(1, 5).b,
		newRaw().file(1, "pagemap-1.img", 0o600).file(2, "pages-1.img", 0o644).
			data(2, "PAGE").data(1, "map").data(2, "S").end(2, "PAGES").end(1, "map").trailer(2, 8).b,
		newRaw().file(1, "..", 0o644).b,
		newRaw().file(1, "a", 0o7777).b,
		oneFile().data(1, "x").b,
		newRaw().trailer(0, 0).b,
		[]byte(magic),
	}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.AddFile(context.Background(), "core-1.img", 0o644, bytes.NewReader(bytes.Repeat([]byte("core"), 100)))
	w.Close()
	seeds = append(seeds, buf.Bytes())
	for _, s := range seeds {
		f.Add(s)
	}
	lim := Limits{MaxBytes: 1 << 20, MaxFiles: 16, MaxOpen: 8}
	f.Fuzz(func(t *testing.T, stream []byte) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "x")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		files, err := Extract(context.Background(), bytes.NewReader(stream), dir, lim)
		if names := dirNames(t, parent); len(names) != 1 || names[0] != "x" {
			t.Fatalf("Extract created %v next to its directory", names)
		}
		ents, rerr := os.ReadDir(dir)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrTooLarge) {
				t.Fatalf("error of no class: %v", err)
			}
			if len(ents) != 0 {
				t.Fatalf("failed Extract (%v) left %d entries", err, len(ents))
			}
			return
		}
		if len(ents) != len(files) {
			t.Fatalf("Extract reported %d files, dir holds %d", len(files), len(ents))
		}
		for _, e := range ents {
			st, err := os.Lstat(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if !ValidName(e.Name()) || !st.Mode().IsRegular() || st.Mode().Perm()&^0o644 != 0 {
				t.Fatalf("Extract created %q with mode %v", e.Name(), st.Mode())
			}
		}
	})
}
