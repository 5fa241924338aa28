package codezip

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"errors"
	"hash/crc32"
	"io"
	"io/fs"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/function"
)

// zent is one entry of a zip built by mkzip.
type zent struct {
	name string
	body string
	mode fs.FileMode // 0 means a regular 0644 file (or a 0755 dir for names ending in /)
}

func file(name, body string) zent { return zent{name: name, body: body} }
func exe(name, body string) zent  { return zent{name: name, body: body, mode: 0o755} }
func dir(name string) zent        { return zent{name: name, mode: fs.ModeDir | 0o755} }
func link(name, target string) zent {
	return zent{name: name, body: target, mode: fs.ModeSymlink | 0o777}
}
func special(name string, m fs.FileMode) zent { return zent{name: name, mode: m} }

// mkzip builds a zip; it writes whatever names it is given, malicious or not.
func mkzip(t testing.TB, ents ...zent) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, e := range ents {
		hdr := &zip.FileHeader{Name: e.name, Method: zip.Deflate}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		hdr.SetMode(mode)
		w, err := zw.CreateHeader(hdr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(w, e.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// bomb is a zip whose one file inflates to n zero bytes.
func bomb(t testing.TB, n int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	zw.RegisterCompressor(zip.Deflate, func(w io.Writer) (io.WriteCloser, error) { return flate.NewWriter(w, flate.BestSpeed) })
	w, err := zw.Create("zeros.bin")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(w, zeroReader{}, n); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// lyingBomb is a zip whose headers claim a 10-byte file that inflates to n
// bytes: a bomb against code that trusts the headers.
func lyingBomb(t testing.TB, n int64) []byte {
	t.Helper()
	var data bytes.Buffer
	fw, _ := flate.NewWriter(&data, flate.BestSpeed)
	crc := crc32.NewIEEE()
	if _, err := io.CopyN(io.MultiWriter(fw, crc), zeroReader{}, n); err != nil {
		t.Fatal(err)
	}
	fw.Close()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	hdr := &zip.FileHeader{Name: "small.txt", Method: zip.Deflate, CRC32: crc.Sum32(),
		CompressedSize64: uint64(data.Len()), UncompressedSize64: 10}
	w, err := zw.CreateRaw(hdr)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(data.Bytes())
	zw.Close()
	return buf.Bytes()
}

// corruptCRC is a zip whose file's CRC does not match its data.
func corruptCRC(t testing.TB) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	hdr := &zip.FileHeader{Name: "a.txt", Method: zip.Store, CRC32: 12345, CompressedSize64: 5, UncompressedSize64: 5}
	w, err := zw.CreateRaw(hdr)
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte("hello"))
	zw.Close()
	return buf.Bytes()
}

// maliciousZips are archives that Validate and Extract must both reject,
// with the error class and a fragment of the message.
func maliciousZips(t testing.TB) []struct {
	name  string
	zip   []byte
	class error
	msg   string
} {
	return []struct {
		name  string
		zip   []byte
		class error
		msg   string
	}{
		{"not a zip", []byte("this is not a zip"), errdefs.ErrInvalid, "not a valid zip"},
		{"dot-dot entry", mkzip(t, file("ok.txt", "x"), file("../evil.txt", "x")), errdefs.ErrInvalid, `"../evil.txt" contains a '..' component`},
		{"dot-dot inside", mkzip(t, file("a/../../evil.txt", "x")), errdefs.ErrInvalid, "'..'"},
		{"dot-dot dir", mkzip(t, dir("../")), errdefs.ErrInvalid, "'..'"},
		{"absolute path", mkzip(t, file("/etc/cron.d/evil", "x")), errdefs.ErrInvalid, `"/etc/cron.d/evil" has an absolute path`},
		{"drive letter", mkzip(t, file("C:/evil", "x")), errdefs.ErrInvalid, "absolute path"},
		{"backslash", mkzip(t, file(`..\evil`, "x")), errdefs.ErrInvalid, "backslash"},
		{"NUL in name", mkzip(t, file("a\x00b", "x")), errdefs.ErrInvalid, "NUL"},
		{"symlink to /etc", mkzip(t, link("etc", "/etc")), errdefs.ErrInvalid, `"etc" is a symlink to "/etc", an absolute path`},
		{"symlink up", mkzip(t, link("up", "../outside")), errdefs.ErrInvalid, "leaves the code root"},
		{"symlink up from subdir", mkzip(t, link("a/b/up", "../../../x")), errdefs.ErrInvalid, "leaves the code root"},
		// x/y -> .. is the root itself (fine alone), but z -> x/y/.. resolves
		// x/y first and so climbs above the root: a string check misses it.
		{"symlink chain escaping", mkzip(t, dir("x/"), link("x/y", ".."), link("z", "x/y/..")), errdefs.ErrInvalid, `"z" is a symlink to "x/y/.."`},
		{"symlink chain via link to link", mkzip(t, link("a", "b/c"), link("b", "d"), link("d", "..")), errdefs.ErrInvalid, "leaves the code root"},
		{"symlink through absolute link", mkzip(t, link("a", "b/passwd"), link("b", "/etc")), errdefs.ErrInvalid, "absolute"},
		{"symlink loop", mkzip(t, link("a", "b"), link("b", "a")), errdefs.ErrInvalid, "loops"},
		{"entry under symlink", mkzip(t, dir("sub/"), link("lib", "sub"), file("lib/x.py", "x")), errdefs.ErrInvalid, `"lib/x.py" lies inside "lib", which is a symlink`},
		{"entry under file", mkzip(t, file("a", "x"), file("a/b", "y")), errdefs.ErrInvalid, "which is a file"},
		{"duplicate file", mkzip(t, file("a.py", "x"), file("a.py", "y")), errdefs.ErrInvalid, "appears twice"},
		{"file and dir", mkzip(t, dir("a/"), file("a", "y")), errdefs.ErrInvalid, "appears twice"},
		{"empty symlink", mkzip(t, link("l", "")), errdefs.ErrInvalid, "empty target"},
		{"named pipe", mkzip(t, special("fifo", fs.ModeNamedPipe|0o644)), errdefs.ErrInvalid, "special file"},
		{"device", mkzip(t, special("dev", fs.ModeDevice|0o644)), errdefs.ErrInvalid, "special file"},
		{"zip bomb", bomb(t, function.MaxCodeUnzipBytes+1), errdefs.ErrTooLarge, `more than 250 MB (the limit was reached at entry "zeros.bin")`},
		{"lying headers", lyingBomb(t, 1<<20), errdefs.ErrInvalid, `"small.txt" is corrupt`},
		{"bad checksum", corruptCRC(t), errdefs.ErrInvalid, `"a.txt" is corrupt`},
	}
}

func TestValidateRejects(t *testing.T) {
	for _, tc := range maliciousZips(t) {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Validate(tc.zip)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, tc.class) {
				t.Errorf("error %q is not %v", err, tc.class)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not contain %q", err, tc.msg)
			}
		})
	}
}

func TestValidateAccepts(t *testing.T) {
	tests := []struct {
		name string
		zip  []byte
		want Info
	}{
		{"empty", mkzip(t), Info{}},
		{"files and dirs", mkzip(t, dir("pkg/"), file("pkg/__init__.py", ""), file("app.py", "def handler(e, c): return e\n"), exe("bin/tool", "#!/bin/sh\n")),
			Info{Files: 3, Dirs: 1, Size: 38}},
		{"dot slash root", mkzip(t, dir("./"), file("./app.py", "x")), Info{Files: 1, Size: 1}},
		{"duplicate dir", mkzip(t, dir("a/"), dir("a/"), file("a/b", "x")), Info{Files: 1, Dirs: 1, Size: 1}},
		{"symlinks inside", mkzip(t,
			file("lib/real.py", "x"),
			link("lib/alias.py", "real.py"),
			link("top", "lib/../lib/real.py"),
			link("a/b/up", "../../lib"),
			link("x/y", ".."),    // the root itself
			link("z", "x/y/lib"), // through a link, still inside
			link("dangling", "nowhere/at/all"),
		), Info{Files: 1, Symlinks: 6, Size: 1 + 7 + 18 + 9 + 2 + 7 + 14}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			info, err := Validate(tc.zip)
			if err != nil {
				t.Fatal(err)
			}
			if info != tc.want {
				t.Errorf("info %+v, want %+v", info, tc.want)
			}
		})
	}
}

func TestValidateLimits(t *testing.T) {
	lim := limits{maxBytes: 100, maxEntries: 3}
	tests := []struct {
		name  string
		zip   []byte
		class error
		msg   string
	}{
		{"at the byte limit", mkzip(t, file("a", strings.Repeat("x", 60)), file("b", strings.Repeat("y", 40))), nil, ""},
		{"over the byte limit in total", mkzip(t, file("a", strings.Repeat("x", 60)), file("b", strings.Repeat("y", 41))), errdefs.ErrTooLarge, `reached at entry "b"`},
		{"too many entries", mkzip(t, file("a", ""), file("b", ""), file("c", ""), file("d", "")), errdefs.ErrTooLarge, "4 entries"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := validate(tc.zip, lim)
			if tc.class == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want %v containing %q", err, tc.class, tc.msg)
			}
		})
	}
}
