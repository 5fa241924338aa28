package archive

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// raw builds archive streams record by record, valid or not, for tests.
type raw struct{ b []byte }

func newRaw() *raw { return &raw{b: append([]byte(magic), Version)} }

func (r *raw) uv(vs ...uint64) *raw {
	for _, v := range vs {
		r.b = binary.AppendUvarint(r.b, v)
	}
	return r
}

func (r *raw) bytes(p ...byte) *raw { r.b = append(r.b, p...); return r }

func (r *raw) file(id uint64, name string, mode uint64) *raw {
	r.bytes(recFile).uv(id, uint64(len(name)))
	r.b = append(r.b, name...)
	return r.uv(mode)
}

func (r *raw) data(id uint64, p string) *raw {
	r.bytes(recData).uv(id, uint64(len(p)))
	r.b = append(r.b, p...)
	return r
}

func (r *raw) end(id uint64, p string) *raw {
	sum := sha256.Sum256([]byte(p))
	r.bytes(recEnd).uv(id, uint64(len(p)))
	return r.bytes(sum[:]...)
}

func (r *raw) trailer(files, total uint64) *raw { return r.bytes(recTrailer).uv(files, total) }

// oneFile is a valid archive of one file "a" holding "hello".
func oneFile() *raw { return newRaw().file(1, "a", 0o644).data(1, "hello").end(1, "hello") }

// emptyDir returns a new empty directory inside its own parent, so that
// tests can check that nothing appeared next to it.
func emptyDir(t testing.TB) (parent, dir string) {
	t.Helper()
	parent = t.TempDir()
	dir = filepath.Join(parent, "x")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return parent, dir
}

func dirNames(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestRoundTripConcurrentWriters(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	sizes := []int{0, 1, 100, MaxChunk - 1, MaxChunk, MaxChunk + 1, 3*MaxChunk + 17, 64 << 10}
	want := map[string][]byte{}
	for i, n := range sizes {
		p := make([]byte, n)
		if i%2 == 0 {
			for j := range p {
				p[j] = byte(rng.Uint32())
			}
		}
		want[fmt.Sprintf("pages-%d.img", i)] = p
	}

	var buf bytes.Buffer
	w := NewWriter(&buf)
	var wg sync.WaitGroup
	errs := make(chan error, len(want))
	for name, p := range want {
		f, err := w.Create(name, 0o640)
		if err != nil {
			t.Fatal(err)
		}
		seed := uint64(len(p))
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, 7))
			rest := p
			for len(rest) > 0 {
				// Odd-sized writes, some larger than a chunk.
				n := min(len(rest), 1+r.IntN(MaxChunk+MaxChunk/2))
				if _, err := f.Write(rest[:n]); err != nil {
					errs <- err
					return
				}
				rest = rest[n:]
			}
			errs <- f.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}

	parent, dir := emptyDir(t)
	got, err := Extract(context.Background(), bytes.NewReader(buf.Bytes()), dir, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("extracted %d files, want %d", len(got), len(want))
	}
	written := map[string]FileInfo{}
	for _, fi := range w.Files() {
		written[fi.Name] = fi
	}
	for _, fi := range got {
		p := want[fi.Name]
		if fi != written[fi.Name] {
			t.Errorf("%s: Extract says %+v, Writer said %+v", fi.Name, fi, written[fi.Name])
		}
		if fi.Size != int64(len(p)) || fi.SHA256 != sha256.Sum256(p) || fi.Mode != 0o640 {
			t.Errorf("%s: info %+v does not match the %d bytes written", fi.Name, fi, len(p))
		}
		disk, err := os.ReadFile(filepath.Join(dir, fi.Name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(disk, p) {
			t.Errorf("%s: contents differ", fi.Name)
		}
		st, err := os.Stat(filepath.Join(dir, fi.Name))
		if err != nil {
			t.Fatal(err)
		}
		if perm := st.Mode().Perm(); perm&^0o644 != 0 || perm&0o600 != 0o600 {
			t.Errorf("%s: mode %v, want owner rw and at most 0644", fi.Name, perm)
		}
	}
	if names := dirNames(t, parent); len(names) != 1 {
		t.Errorf("parent holds %v, want only x", names)
	}
}

func TestEmptyArchive(t *testing.T) {
	var buf bytes.Buffer
	if err := NewWriter(&buf).Close(); err != nil {
		t.Fatal(err)
	}
	_, dir := emptyDir(t)
	files, err := Extract(context.Background(), &buf, dir, Limits{})
	if err != nil || len(files) != 0 {
		t.Fatalf("Extract = %v, %v; want no files", files, err)
	}
}

func TestWriterErrors(t *testing.T) {
	tests := []struct {
		name string
		do   func(w *Writer) error
		want string
	}{
		{"slash in name", func(w *Writer) error { _, err := w.Create("a/b", 0o644); return err }, "not allowed"},
		{"dot dot", func(w *Writer) error { _, err := w.Create("..", 0o644); return err }, "not allowed"},
		{"empty name", func(w *Writer) error { _, err := w.Create("", 0o644); return err }, "not allowed"},
		{"long name", func(w *Writer) error { _, err := w.Create(strings.Repeat("a", MaxNameLen+1), 0o644); return err }, "not allowed"},
		{"setuid", func(w *Writer) error { _, err := w.Create("a", 0o755|fs.ModeSetuid); return err }, "besides the permissions"},
		{"directory", func(w *Writer) error { _, err := w.Create("a", fs.ModeDir|0o755); return err }, "besides the permissions"},
		{"duplicate", func(w *Writer) error {
			f, _ := w.Create("a", 0o644)
			f.Close()
			_, err := w.Create("a", 0o644)
			return err
		}, "added twice"},
		{"close with open file", func(w *Writer) error {
			w.Create("b", 0o644)
			w.Create("a", 0o644)
			return w.Close()
		}, "2 file(s) still open (a, b)"},
		{"write after file close", func(w *Writer) error {
			f, _ := w.Create("a", 0o644)
			f.Close()
			_, err := f.Write([]byte("x"))
			return err
		}, "write after close"},
		{"create after close", func(w *Writer) error {
			w.Close()
			_, err := w.Create("a", 0o644)
			return err
		}, "closed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do(NewWriter(io.Discard))
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalid containing %q", err, tt.want)
			}
		})
	}
}

// failWriter fails every write after the first n bytes.
type failWriter struct{ n int }

var errDisk = errors.New("disk on fire")

func (f *failWriter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		n := f.n
		f.n = 0
		return n, errDisk
	}
	f.n -= len(p)
	return len(p), nil
}

func TestWriterStickyError(t *testing.T) {
	w := NewWriter(&failWriter{n: 100})
	f, err := w.Create("a", 0o644)
	if err != nil {
		t.Fatal(err)
	}
	// The bufio layer defers the failure; a large write reaches it.
	if _, err := f.Write(make([]byte, 1<<20)); !errors.Is(err, errDisk) {
		t.Fatalf("write: %v, want %v", err, errDisk)
	}
	if err := f.Close(); !errors.Is(err, errDisk) {
		t.Fatalf("close file: %v, want %v", err, errDisk)
	}
	if _, err := w.Create("b", 0o644); !errors.Is(err, errDisk) {
		t.Fatalf("create: %v, want %v", err, errDisk)
	}
}

func TestExtractRejects(t *testing.T) {
	long := strings.Repeat("n", 300)
	tests := []struct {
		name   string
		stream []byte
		lim    Limits
		class  error
		want   string
	}{
		{"empty stream", nil, Limits{}, errdefs.ErrInvalid, "empty"},
		{"bad magic", []byte("PK\x03\x04 this is a zip"), Limits{}, errdefs.ErrInvalid, "not a torpor archive"},
		{"truncated magic", []byte(magic[:4]), Limits{}, errdefs.ErrInvalid, "truncated in its header"},
		{"no version", []byte(magic), Limits{}, errdefs.ErrInvalid, "truncated in its header"},
		{"future version", append([]byte(magic), 2), Limits{}, errdefs.ErrInvalid, "version 2 is not supported"},
		{"no trailer", oneFile().b, Limits{}, errdefs.ErrInvalid, "truncated: the stream ends after 1 complete file(s)"},
		{"truncated in data", newRaw().file(1, "a", 0o644).data(1, "hello").b[:20], Limits{}, errdefs.ErrInvalid, "truncated in the data of file \"a\""},
		{"truncated in varint", newRaw().bytes(recFile, 0x80).b, Limits{}, errdefs.ErrInvalid, "truncated in the file id"},
		{"truncated in digest", oneFile().b[:len(oneFile().b)-3], Limits{}, errdefs.ErrInvalid, "truncated in the file digest"},
		{"unknown record", newRaw().bytes('Z').b, Limits{}, errdefs.ErrInvalid, "unknown record type 0x5a"},
		{"varint overflow", newRaw().bytes(recFile, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01).b, Limits{}, errdefs.ErrInvalid, "file id: binary: varint overflows"},
		{"first id not 1", newRaw().file(2, "a", 0o644).b, Limits{}, errdefs.ErrInvalid, "id 2, want 1"},
		{"reused id", oneFile().file(1, "b", 0o644).b, Limits{}, errdefs.ErrInvalid, "id 1, want 2"},
		{"duplicate name", oneFile().file(2, "a", 0o644).b, Limits{}, errdefs.ErrInvalid, `name "a" appears twice`},
		{"slash", newRaw().file(1, "../etc/passwd", 0o644).b, Limits{}, errdefs.ErrInvalid, "not allowed"},
		{"dot dot", newRaw().file(1, "..", 0o644).b, Limits{}, errdefs.ErrInvalid, "not allowed"},
		{"dot", newRaw().file(1, ".", 0o644).b, Limits{}, errdefs.ErrInvalid, "not allowed"},
		{"nul in name", newRaw().file(1, "a\x00b", 0o644).b, Limits{}, errdefs.ErrInvalid, "not allowed"},
		{"empty name", newRaw().file(1, "", 0o644).b, Limits{}, errdefs.ErrInvalid, "name of 0 bytes"},
		{"name too long", newRaw().file(1, long, 0o644).b, Limits{}, errdefs.ErrInvalid, "name of 300 bytes"},
		{"name over limit", newRaw().file(1, "abcdef", 0o644).b, Limits{MaxNameLen: 5}, errdefs.ErrInvalid, "name of 6 bytes (allowed: 1 to 5)"},
		{"setuid mode", newRaw().file(1, "a", 0o4755).b, Limits{}, errdefs.ErrInvalid, "bits besides the permissions"},
		{"data for unknown id", newRaw().data(1, "x").b, Limits{}, errdefs.ErrInvalid, "data record for unknown file id 1"},
		{"data after end", oneFile().data(1, "more").b, Limits{}, errdefs.ErrInvalid, "data record for file id 1 after that file's end record"},
		{"end twice", oneFile().end(1, "hello").b, Limits{}, errdefs.ErrInvalid, "end record for file id 1 after that file's end record"},
		{"end for unknown id", newRaw().end(7, "").b, Limits{}, errdefs.ErrInvalid, "end record for unknown file id 7"},
		{"empty data record", newRaw().file(1, "a", 0o644).data(1, "").b, Limits{}, errdefs.ErrInvalid, "data record of 0 bytes"},
		{"oversized chunk", newRaw().file(1, "a", 0o644).bytes(recData).uv(1, MaxChunk+1).b, Limits{}, errdefs.ErrInvalid, "data record of 1048577 bytes"},
		{"size mismatch", newRaw().file(1, "a", 0o644).data(1, "hello").end(1, "hell").b, Limits{}, errdefs.ErrInvalid, `file "a": the end record says 4 bytes but 5 came`},
		{"digest mismatch", newRaw().file(1, "a", 0o644).data(1, "hello").end(1, "jello").b, Limits{}, errdefs.ErrInvalid, `file "a": sha256 mismatch`},
		{"trailer with open file", newRaw().file(1, "a", 0o644).trailer(0, 0).b, Limits{}, errdefs.ErrInvalid, "1 file(s) have no end record (a)"},
		{"trailer file count", oneFile().trailer(2, 5).b, Limits{}, errdefs.ErrInvalid, "counts 2 files but 1 came"},
		{"trailer byte count", oneFile().trailer(1, 6).b, Limits{}, errdefs.ErrInvalid, "counts 6 bytes but 5 came"},
		{"data after trailer", oneFile().trailer(1, 5).bytes(0).b, Limits{}, errdefs.ErrInvalid, "data after the trailer"},
		{"too many files", oneFile().file(2, "b", 0o644).b, Limits{MaxFiles: 1}, errdefs.ErrTooLarge, "more than 1 files"},
		{"too many open", newRaw().file(1, "a", 0o644).file(2, "b", 0o644).b, Limits{MaxOpen: 1}, errdefs.ErrTooLarge, "more than 1 files open at once"},
		{"too many bytes", oneFile().b, Limits{MaxBytes: 4}, errdefs.ErrTooLarge, "more than 4 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent, dir := emptyDir(t)
			files, err := Extract(context.Background(), bytes.NewReader(tt.stream), dir, tt.lim)
			if !errors.Is(err, tt.class) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Extract = %v, %v\nwant %v containing %q", files, err, tt.class, tt.want)
			}
			if names := dirNames(t, dir); len(names) != 0 {
				t.Errorf("dir holds %v after a failed Extract, want it empty", names)
			}
			if names := dirNames(t, parent); len(names) != 1 {
				t.Errorf("parent holds %v, want only x", names)
			}
		})
	}
}

func TestExtractValidHandMade(t *testing.T) {
	// Two files interleaved, ended out of order: what a --stream dump does.
	s := newRaw().file(1, "pagemap-1.img", 0o600).file(2, "pages-1.img", 0o644).
		data(2, "PAGE").data(1, "map").data(2, "S").end(2, "PAGES").end(1, "map").trailer(2, 8)
	_, dir := emptyDir(t)
	files, err := Extract(context.Background(), bytes.NewReader(s.b), dir, Limits{MaxBytes: 8, MaxFiles: 2, MaxOpen: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 2 || files[0].Name != "pages-1.img" || files[1].Name != "pagemap-1.img" {
		t.Fatalf("files = %+v", files)
	}
	for name, want := range map[string]string{"pages-1.img": "PAGES", "pagemap-1.img": "map"} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
}

func TestExtractDirMustBeEmpty(t *testing.T) {
	_, dir := emptyDir(t)
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "a")); err != nil {
		t.Fatal(err)
	}
	_, err := Extract(context.Background(), bytes.NewReader(oneFile().trailer(1, 5).b), dir, Limits{})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("err = %v, want ErrInvalid saying the directory is not empty", err)
	}
	if _, err := Extract(context.Background(), bytes.NewReader(nil), filepath.Join(dir, "missing"), Limits{}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing dir: err = %v, want fs.ErrNotExist", err)
	}
}

func TestExtractContextCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, dir := emptyDir(t)
	_, err := Extract(ctx, bytes.NewReader(oneFile().trailer(1, 5).b), dir, Limits{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// errReader yields its data, then err.
type errReader struct {
	data []byte
	err  error
}

func (r *errReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestExtractSourceError(t *testing.T) {
	errNet := errors.New("connection reset")
	for _, cut := range []int{0, 5, 11, 20, len(oneFile().b)} {
		t.Run(fmt.Sprint(cut), func(t *testing.T) {
			_, dir := emptyDir(t)
			_, err := Extract(context.Background(), &errReader{data: oneFile().b[:cut], err: errNet}, dir, Limits{})
			if !errors.Is(err, errNet) || errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("err = %v, want the source's error, not ErrInvalid", err)
			}
			if names := dirNames(t, dir); len(names) != 0 {
				t.Errorf("dir holds %v", names)
			}
		})
	}
}

func TestAddDir(t *testing.T) {
	src := t.TempDir()
	want := map[string]string{"core-1.img": "core", "pages-1.img": strings.Repeat("p", 3*MaxChunk), "inventory.img": ""}
	for name, data := range want {
		if err := os.WriteFile(filepath.Join(src, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := w.AddDir(context.Background(), src); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	_, dir := emptyDir(t)
	files, err := Extract(context.Background(), &buf, dir, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(want) {
		t.Fatalf("files = %+v", files)
	}
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(got) != data {
			t.Errorf("%s: %d bytes, %v; want %d bytes", name, len(got), err, len(data))
		}
	}

	t.Run("subdirectory", func(t *testing.T) {
		d := t.TempDir()
		os.Mkdir(filepath.Join(d, "sub"), 0o755)
		err := NewWriter(io.Discard).AddDir(context.Background(), d)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), `"sub" is not a regular file`) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("symlink", func(t *testing.T) {
		d := t.TempDir()
		os.Symlink("/etc/passwd", filepath.Join(d, "l"))
		err := NewWriter(io.Discard).AddDir(context.Background(), d)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), `"l" is not a regular file`) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		w := NewWriter(io.Discard)
		if err := w.AddDir(ctx, src); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		// The half-added file is still open: the archive cannot be finished.
		if err := w.Close(); err == nil {
			t.Fatal("Close after a failed AddDir succeeded")
		}
	})
}

func TestSkipDigests(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.SkipDigests()
	f, err := w.Create("pages-1.img", 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// Extract accepts the unrecorded digests, with or without checking.
	for _, skip := range []bool{false, true} {
		dir := t.TempDir()
		files, err := Extract(context.Background(), bytes.NewReader(buf.Bytes()), dir, Limits{SkipFileDigests: skip})
		if err != nil || len(files) != 1 || files[0].Size != 4 {
			t.Errorf("SkipFileDigests=%v: Extract = %+v, %v", skip, files, err)
		}
	}
}
