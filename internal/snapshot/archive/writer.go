package archive

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// errWriterClosed is returned by every call on a closed Writer.
var errWriterClosed = errdefs.Invalid("archive writer is closed")

// Writer encodes an archive onto one underlying stream. Files are added with
// Create and may be written at the same time from different goroutines; each
// Write is cut into records of at most MaxChunk bytes that are appended to
// the stream under a mutex. Close writes the trailer; without it the stream
// is truncated and Extract rejects it.
//
// The first error from the underlying writer is sticky: every later call
// returns it.
type Writer struct {
	mu     sync.Mutex
	bw     *bufio.Writer
	err    error // sticky
	header bool  // magic and version written
	closed bool
	lastID uint64
	open   map[uint64]*fileWriter
	names  map[string]struct{}
	files  []FileInfo
	total  int64
	rec    [1 + 3*binary.MaxVarintLen64]byte // record header scratch, under mu
	// noDigests: end records carry an all-zero digest (SkipDigests).
	noDigests bool
}

// NewWriter returns a Writer that writes the archive to w. The header is
// written with the first record (or on Close), so NewWriter itself does no
// I/O. The caller closes w, after Close.
func NewWriter(w io.Writer) *Writer {
	return &Writer{
		bw:    bufio.NewWriterSize(w, 64<<10),
		open:  map[uint64]*fileWriter{},
		names: map[string]struct{}{},
	}
}

// SkipDigests makes the files created from now on end with an all-zero
// digest, which Extract takes for "not recorded", instead of their sha256:
// for a caller that digests (and signs) the whole stream itself, as
// image.Write does. Hashing every byte was the largest CPU cost of
// archiving a dump.
func (w *Writer) SkipDigests() {
	w.mu.Lock()
	w.noDigests = true
	w.mu.Unlock()
}

// Create adds a file and returns the writer for its contents; closing it
// ends the file (writes its size and sha256). Many files may be open at
// once. One file's writer must not be used by two goroutines at the same
// time, but different files' writers may.
//
// name must satisfy ValidName and be new in this archive; mode may hold
// permission bits only (no type, setuid, setgid or sticky bits).
func (w *Writer) Create(name string, mode fs.FileMode) (io.WriteCloser, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if mode&^fs.ModePerm != 0 {
		return nil, errdefs.Invalid(fmt.Sprintf("archive file %q: mode %v has bits besides the permissions; only regular files with mode ≤ 0o777 can be archived", name, mode))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usableLocked(); err != nil {
		return nil, err
	}
	if _, dup := w.names[name]; dup {
		return nil, errdefs.Invalid(fmt.Sprintf("archive file %q is added twice: each name may appear once", name))
	}
	id := w.lastID + 1
	b := append(w.rec[:0], recFile)
	b = binary.AppendUvarint(b, id)
	b = binary.AppendUvarint(b, uint64(len(name)))
	if err := w.writeLocked(b, []byte(name)); err != nil {
		return nil, err
	}
	b = binary.AppendUvarint(w.rec[:0], uint64(mode.Perm()))
	if err := w.writeLocked(b, nil); err != nil {
		return nil, err
	}
	w.lastID = id
	f := &fileWriter{w: w, id: id, name: name, mode: mode.Perm()}
	if !w.noDigests {
		f.h = sha256.New()
	}
	w.open[id] = f
	w.names[name] = struct{}{}
	return f, nil
}

// AddFile adds a file with the contents of r, read to EOF. It stops when ctx
// is cancelled.
func (w *Writer) AddFile(ctx context.Context, name string, mode fs.FileMode, r io.Reader) error {
	f, err := w.Create(name, mode)
	if err != nil {
		return err
	}
	buf := make([]byte, 256<<10)
	if _, err := io.CopyBuffer(f, blob.ContextReader(ctx, r), buf); err != nil {
		// The file stays open: Close refuses to finish a half-added file.
		return fmt.Errorf("archive file %q: %w", name, err)
	}
	return f.Close()
}

// AddDir adds every file of dir, in name order. dir must be flat: a
// subdirectory, symlink or special file is an error, because a CRIU image
// directory never holds one and guessing what was meant would be worse.
func (w *Writer) AddDir(ctx context.Context, dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("archive directory %s: %w", dir, err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return errdefs.Invalid(fmt.Sprintf("archive directory %s: %q is not a regular file (%v): only flat directories of regular files can be archived", dir, e.Name(), e.Type()))
		}
		if err := w.addPath(ctx, filepath.Join(dir, e.Name()), e.Name()); err != nil {
			return err
		}
	}
	return nil
}

func (w *Writer) addPath(ctx context.Context, path, name string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("archive: %w", err)
	}
	if !st.Mode().IsRegular() {
		return errdefs.Invalid(fmt.Sprintf("archive: %s is not a regular file (%v)", path, st.Mode().Type()))
	}
	return w.AddFile(ctx, name, st.Mode().Perm(), f)
}

// Files returns the files ended so far, in the order they were closed.
func (w *Writer) Files() []FileInfo {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.files)
}

// Close writes the trailer and flushes the stream. It fails, and writes
// nothing, while a file is still open: an archive must not silently miss the
// end of a file. Close does not close the underlying writer.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return w.err
	}
	if w.err != nil {
		return w.err
	}
	if len(w.open) > 0 {
		var names []string
		for _, f := range w.open {
			names = append(names, f.name)
		}
		slices.Sort(names)
		return errdefs.Invalid(fmt.Sprintf("archive close: %d file(s) still open (%s): close every file first", len(names), strings.Join(names, ", ")))
	}
	b := append(w.rec[:0], recTrailer)
	b = binary.AppendUvarint(b, uint64(len(w.files)))
	b = binary.AppendUvarint(b, uint64(w.total))
	if err := w.writeLocked(b, nil); err != nil {
		return err
	}
	if err := w.bw.Flush(); err != nil {
		w.err = fmt.Errorf("archive: %w", err)
		return w.err
	}
	w.closed = true
	return nil
}

// usableLocked reports the sticky error, or that the writer is closed.
func (w *Writer) usableLocked() error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return errWriterClosed
	}
	return nil
}

// writeLocked writes the header if not yet written, then a and b.
func (w *Writer) writeLocked(a, b []byte) error {
	if !w.header {
		w.header = true
		if _, err := w.bw.WriteString(magic); err != nil {
			w.err = fmt.Errorf("archive: %w", err)
			return w.err
		}
		if err := w.bw.WriteByte(Version); err != nil {
			w.err = fmt.Errorf("archive: %w", err)
			return w.err
		}
	}
	if _, err := w.bw.Write(a); err != nil {
		w.err = fmt.Errorf("archive: %w", err)
		return w.err
	}
	if len(b) > 0 {
		if _, err := w.bw.Write(b); err != nil {
			w.err = fmt.Errorf("archive: %w", err)
			return w.err
		}
	}
	return nil
}

// writeData appends one data record for file id.
func (w *Writer) writeData(f *fileWriter, p []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usableLocked(); err != nil {
		return err
	}
	b := append(w.rec[:0], recData)
	b = binary.AppendUvarint(b, f.id)
	b = binary.AppendUvarint(b, uint64(len(p)))
	if err := w.writeLocked(b, p); err != nil {
		return err
	}
	w.total += int64(len(p))
	return nil
}

// endFile writes the end record of f.
func (w *Writer) endFile(f *fileWriter, sum [sha256.Size]byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.usableLocked(); err != nil {
		return err
	}
	b := append(w.rec[:0], recEnd)
	b = binary.AppendUvarint(b, f.id)
	b = binary.AppendUvarint(b, uint64(f.size))
	if err := w.writeLocked(b, sum[:]); err != nil {
		return err
	}
	delete(w.open, f.id)
	w.files = append(w.files, FileInfo{Name: f.name, Size: f.size, Mode: f.mode, SHA256: sum})
	return nil
}

// fileWriter is the WriteCloser of one archived file.
type fileWriter struct {
	w      *Writer
	id     uint64
	name   string
	mode   fs.FileMode
	h      hash.Hash
	size   int64
	closed bool
}

// Write cuts p into records of at most MaxChunk bytes. The file's digest is
// computed outside the Writer's lock, so that files written from different
// goroutines hash in parallel.
func (f *fileWriter) Write(p []byte) (int, error) {
	if f.closed {
		return 0, errdefs.Invalid(fmt.Sprintf("archive file %q: write after close", f.name))
	}
	n := 0
	for len(p) > 0 {
		c := min(len(p), MaxChunk)
		if err := f.w.writeData(f, p[:c]); err != nil {
			return n, err
		}
		if f.h != nil {
			f.h.Write(p[:c])
		}
		f.size += int64(c)
		n += c
		p = p[c:]
	}
	return n, nil
}

// Close ends the file. Closing it again does nothing.
func (f *fileWriter) Close() error {
	if f.closed {
		return nil
	}
	var sum [sha256.Size]byte
	if f.h != nil {
		copy(sum[:], f.h.Sum(nil))
	}
	if err := f.w.endFile(f, sum); err != nil {
		return err
	}
	f.closed = true
	return nil
}
