package archive

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// Defaults for the zero fields of Limits. They are generous: callers that
// know what to expect (package image knows the size and file count from the
// signed manifest) pass tight limits.
const (
	DefaultMaxBytes = 64 << 30
	DefaultMaxFiles = 10_000
	DefaultMaxOpen  = 256
)

// Limits bound what Extract accepts, so that a hostile stream can neither
// fill the disk (a decompression bomb), exhaust inodes or file descriptors,
// nor make Extract allocate much. A zero field means its default.
type Limits struct {
	MaxBytes   int64 // total bytes of all files (DefaultMaxBytes)
	MaxFiles   int   // number of files (DefaultMaxFiles)
	MaxNameLen int   // bytes in one file name (MaxNameLen, which it cannot exceed)
	MaxOpen    int   // files open at the same time (DefaultMaxOpen)
	// SkipFileDigests skips checking each file against the sha256 of its
	// end record, for a caller that verifies a digest of the whole stream
	// itself (image.Read checks the signed digest of the data): hashing
	// every byte twice was a third of a restore's CPU.
	SkipFileDigests bool
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	if l.MaxFiles <= 0 {
		l.MaxFiles = DefaultMaxFiles
	}
	if l.MaxNameLen <= 0 || l.MaxNameLen > MaxNameLen {
		l.MaxNameLen = MaxNameLen
	}
	if l.MaxOpen <= 0 {
		l.MaxOpen = DefaultMaxOpen
	}
	return l
}

// Extract decodes the archive read from r into dir, which must exist and be
// empty, and returns its files in the order they were completed.
//
// Files are created inside dir only (through os.Root, with O_EXCL and
// O_NOFOLLOW), never with more than mode 0o644 (owner read-write, group and
// others read if the archive says so, never execute, setuid or the like),
// and each file's size and sha256 and the trailer's totals are checked. A
// malformed stream is an errdefs.ErrInvalid error, a limit exceeded an
// errdefs.ErrTooLarge one; an error from r is returned wrapped. On any
// error the files created so far are removed, leaving dir empty.
//
// Extract checks only that the archive is self-consistent: whoever wrote it
// also wrote the digests. Callers that need authenticity check a digest of
// the whole stream (package image does) before using the files.
func Extract(ctx context.Context, r io.Reader, dir string, lim Limits) (_ []FileInfo, err error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("extract archive: %w", err)
	}
	defer root.Close()
	d, err := root.Open(".")
	if err != nil {
		return nil, fmt.Errorf("extract archive: %w", err)
	}
	names, err := d.Readdirnames(1)
	d.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("extract archive into %s: %w", dir, err)
	}
	if len(names) > 0 {
		return nil, errdefs.Invalid(fmt.Sprintf("extract archive into %s: the directory is not empty (it holds %q): extract into a new, empty directory", dir, names[0]))
	}
	x := &extractor{
		ctx:   ctx,
		br:    bufio.NewReaderSize(r, 64<<10),
		root:  root,
		lim:   lim.withDefaults(),
		open:  map[uint64]*outFile{},
		names: map[string]struct{}{},
	}
	defer func() {
		if err != nil {
			x.cleanup()
		}
	}()
	return x.run()
}

// outFile is a file being extracted.
type outFile struct {
	f    *os.File
	name string
	mode fs.FileMode
	h    hash.Hash
	size int64
}

// extractor holds the state of one Extract.
type extractor struct {
	ctx     context.Context
	br      *bufio.Reader
	off     int64 // offset of the next byte to read
	recOff  int64 // offset of the record being decoded
	root    *os.Root
	lim     Limits
	lastID  uint64
	open    map[uint64]*outFile
	names   map[string]struct{}
	created []string
	files   []FileInfo
	total   int64
	buf     []byte
	// readFailed is set when the source returned an error other than EOF
	// inside a varint, to tell it from a malformed varint.
	readFailed bool
}

func (x *extractor) run() ([]FileInfo, error) {
	if err := x.readHeader(); err != nil {
		return nil, err
	}
	for {
		if err := x.ctx.Err(); err != nil {
			return nil, fmt.Errorf("extract archive: %w", err)
		}
		x.recOff = x.off
		t, err := x.br.ReadByte()
		if errors.Is(err, io.EOF) {
			return nil, x.invalid("archive is truncated: the stream ends after %d complete file(s) with no trailer", len(x.files))
		}
		if err != nil {
			return nil, x.readErr(err, "record type")
		}
		x.off++
		switch t {
		case recFile:
			err = x.fileRecord()
		case recData:
			err = x.dataRecord()
		case recEnd:
			err = x.endRecord()
		case recTrailer:
			return x.trailer()
		default:
			err = x.invalid("unknown record type 0x%02x: the stream is corrupt or from a newer format", t)
		}
		if err != nil {
			return nil, err
		}
	}
}

func (x *extractor) readHeader() error {
	var h [len(magic) + 1]byte
	n, err := io.ReadFull(x.br, h[:])
	x.off += int64(n)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return x.readErr(err, "header")
	}
	m := min(n, len(magic))
	switch {
	case n == 0:
		return x.invalid("the stream is empty: not a torpor archive")
	case string(h[:m]) != magic[:m]:
		return x.invalid("not a torpor archive (it starts with % x)", h[:m])
	case n < len(h):
		return x.invalid("archive is truncated in its header")
	case h[len(magic)] != Version:
		return x.invalid("archive format version %d is not supported: this build reads version %d", h[len(magic)], Version)
	}
	return nil
}

func (x *extractor) fileRecord() error {
	id, err := x.uvarint("file id")
	if err != nil {
		return err
	}
	if id != x.lastID+1 {
		return x.invalid("file record has id %d, want %d (ids count up from 1 and are never reused)", id, x.lastID+1)
	}
	nameLen, err := x.uvarint("name length")
	if err != nil {
		return err
	}
	if nameLen == 0 || nameLen > uint64(x.lim.MaxNameLen) {
		return x.invalid("file %d: name of %d bytes (allowed: 1 to %d)", id, nameLen, x.lim.MaxNameLen)
	}
	nb := make([]byte, nameLen)
	if err := x.full(nb, "file name"); err != nil {
		return err
	}
	name := string(nb)
	if !ValidName(name) {
		return x.invalid("file %d: name %q is not allowed (use A-Z a-z 0-9 . _ -, no slashes, not \".\" or \"..\")", id, name)
	}
	if _, dup := x.names[name]; dup {
		return x.invalid("file %d: name %q appears twice", id, name)
	}
	mode, err := x.uvarint("file mode")
	if err != nil {
		return err
	}
	if mode > uint64(fs.ModePerm) {
		return x.invalid("file %q: mode %#o has bits besides the permissions", name, mode)
	}
	if len(x.files)+len(x.open) >= x.lim.MaxFiles {
		return x.tooLarge("the archive has more than %d files", x.lim.MaxFiles)
	}
	if len(x.open) >= x.lim.MaxOpen {
		return x.tooLarge("the archive has more than %d files open at once", x.lim.MaxOpen)
	}
	perm := 0o600 | fs.FileMode(mode)&0o044
	f, err := x.root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|oNoFollow, perm)
	if err != nil {
		return fmt.Errorf("extract archive: create %q: %w", name, err)
	}
	x.created = append(x.created, name)
	x.lastID = id
	x.names[name] = struct{}{}
	of := &outFile{f: f, name: name, mode: fs.FileMode(mode)}
	if !x.lim.SkipFileDigests {
		of.h = sha256.New()
	}
	x.open[id] = of
	return nil
}

func (x *extractor) dataRecord() error {
	id, err := x.uvarint("data file id")
	if err != nil {
		return err
	}
	f, err := x.lookup(id, "data")
	if err != nil {
		return err
	}
	n, err := x.uvarint("data length")
	if err != nil {
		return err
	}
	if n == 0 || n > MaxChunk {
		return x.invalid("file %q: data record of %d bytes (allowed: 1 to %d)", f.name, n, MaxChunk)
	}
	if int64(n) > x.lim.MaxBytes-x.total {
		return x.tooLarge("the archive holds more than %d bytes of files", x.lim.MaxBytes)
	}
	if x.buf == nil {
		x.buf = make([]byte, MaxChunk)
	}
	p := x.buf[:n]
	if err := x.full(p, fmt.Sprintf("data of file %q", f.name)); err != nil {
		return err
	}
	if f.h != nil {
		f.h.Write(p)
	}
	if _, err := f.f.Write(p); err != nil {
		return fmt.Errorf("extract archive: write %q: %w", f.name, err)
	}
	f.size += int64(n)
	x.total += int64(n)
	return nil
}

func (x *extractor) endRecord() error {
	id, err := x.uvarint("end file id")
	if err != nil {
		return err
	}
	f, err := x.lookup(id, "end")
	if err != nil {
		return err
	}
	size, err := x.uvarint("file size")
	if err != nil {
		return err
	}
	var sum [sha256.Size]byte
	if err := x.full(sum[:], "file digest"); err != nil {
		return err
	}
	if size != uint64(f.size) {
		return x.invalid("file %q: the end record says %d bytes but %d came", f.name, size, f.size)
	}
	var got [sha256.Size]byte
	if f.h != nil {
		copy(got[:], f.h.Sum(nil))
	}
	// An all-zero digest was not recorded (Writer.SkipDigests).
	if f.h != nil && sum != ([sha256.Size]byte{}) && got != sum {
		return x.invalid("file %q: sha256 mismatch (the data does not match the end record)", f.name)
	}
	delete(x.open, id)
	if err := f.f.Close(); err != nil {
		return fmt.Errorf("extract archive: close %q: %w", f.name, err)
	}
	x.files = append(x.files, FileInfo{Name: f.name, Size: f.size, Mode: f.mode, SHA256: sum})
	return nil
}

func (x *extractor) trailer() ([]FileInfo, error) {
	count, err := x.uvarint("trailer file count")
	if err != nil {
		return nil, err
	}
	total, err := x.uvarint("trailer byte count")
	if err != nil {
		return nil, err
	}
	if len(x.open) > 0 {
		var names []string
		for _, f := range x.open {
			names = append(names, f.name)
		}
		slices.Sort(names)
		return nil, x.invalid("trailer while %d file(s) have no end record (%s)", len(names), strings.Join(names, ", "))
	}
	if count != uint64(len(x.files)) {
		return nil, x.invalid("the trailer counts %d files but %d came", count, len(x.files))
	}
	if total != uint64(x.total) {
		return nil, x.invalid("the trailer counts %d bytes but %d came", total, x.total)
	}
	x.recOff = x.off
	switch _, err := x.br.ReadByte(); {
	case err == nil:
		return nil, x.invalid("data after the trailer")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return nil, x.invalid("the stream does not end cleanly after the trailer (%v)", err)
	case !errors.Is(err, io.EOF):
		return nil, x.readErr(err, "end of stream")
	}
	return x.files, nil
}

// lookup returns the open file id, or an error saying why there is none.
func (x *extractor) lookup(id uint64, rec string) (*outFile, error) {
	if f, ok := x.open[id]; ok {
		return f, nil
	}
	if id >= 1 && id <= x.lastID {
		return nil, x.invalid("%s record for file id %d after that file's end record", rec, id)
	}
	return nil, x.invalid("%s record for unknown file id %d", rec, id)
}

// uvarint reads one varint field.
func (x *extractor) uvarint(what string) (uint64, error) {
	v, err := binary.ReadUvarint(countingByteReader{x})
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return 0, x.invalid("archive is truncated in the %s", what)
		}
		if x.readFailed {
			return 0, x.readErr(err, what)
		}
		return 0, x.invalid("%s: %v", what, err)
	}
	return v, nil
}

// full reads exactly len(p) bytes.
func (x *extractor) full(p []byte, what string) error {
	n, err := io.ReadFull(x.br, p)
	x.off += int64(n)
	if err != nil {
		return x.readErr(err, what)
	}
	return nil
}

// readErr turns an error from the source into an error naming the offset:
// an early end is a truncated archive, anything else is the source's own.
func (x *extractor) readErr(err error, what string) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return x.invalid("archive is truncated in the %s (at offset %d)", what, x.off)
	}
	return fmt.Errorf("extract archive: read %s at offset %d: %w", what, x.off, err)
}

func (x *extractor) invalid(format string, args ...any) error {
	return errdefs.Invalid(fmt.Sprintf("archive record at offset %d: ", x.recOff) + fmt.Sprintf(format, args...))
}

func (x *extractor) tooLarge(format string, args ...any) error {
	return errdefs.TooLarge(fmt.Sprintf("archive record at offset %d: ", x.recOff) + fmt.Sprintf(format, args...) + ": it does not fit the limits it is extracted with")
}

// cleanup closes and removes every file created, leaving dir as it was.
func (x *extractor) cleanup() {
	for _, f := range x.open {
		f.f.Close()
	}
	for _, name := range x.created {
		_ = x.root.Remove(name)
	}
}

// countingByteReader feeds binary.ReadUvarint and keeps the offset.
type countingByteReader struct{ x *extractor }

func (c countingByteReader) ReadByte() (byte, error) {
	b, err := c.x.br.ReadByte()
	if err == nil {
		c.x.off++
	} else if !errors.Is(err, io.EOF) {
		c.x.readFailed = true
	}
	return b, err
}
