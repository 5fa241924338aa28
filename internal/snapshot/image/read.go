package image

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/snapshot/archive"
)

// Read-ahead buffers between the pipeline's stages.
const (
	downloadBuf   = 1 << 20
	downloadDepth = 8
	inflateBuf    = 1 << 20
	inflateDepth  = 4
)

// Compat describes the node that restores: an image is restored only where
// it can work.
type Compat struct {
	Arch        string // GOARCH-style, must equal the image's
	Kernel      string // uname -r; major.minor must be ≥ the image's
	Runtime     string // must equal the image's, e.g. "python 3.11.7"
	CRIUVersion string // major.minor must be ≥ the image's
}

// Check returns an ErrIncompatible error naming the first field in which m
// does not suit this node, or nil. id only names the snapshot in the error.
func (c Compat) Check(id string, m Manifest) error {
	if m.Arch != c.Arch {
		return refuse(ErrIncompatible, nil, "snapshot %s: made on arch %q, this node is %q", id, m.Arch, c.Arch)
	}
	if m.Runtime != c.Runtime {
		return refuse(ErrIncompatible, nil, "snapshot %s: made with runtime %q, this node has %q", id, m.Runtime, c.Runtime)
	}
	for _, f := range []struct{ what, image, node string }{
		{"kernel", m.Kernel, c.Kernel},
		{"CRIU", m.CRIUVersion, c.CRIUVersion},
	} {
		imaj, imin, ok := majorMinor(f.image)
		if !ok {
			return refuse(ErrIncompatible, nil, "snapshot %s: %s version %q of the image does not parse as major.minor", id, f.what, f.image)
		}
		nmaj, nmin, ok := majorMinor(f.node)
		if !ok {
			return refuse(ErrIncompatible, nil, "snapshot %s: this node's %s version %q does not parse as major.minor", id, f.what, f.node)
		}
		if nmaj < imaj || nmaj == imaj && nmin < imin {
			return refuse(ErrIncompatible, nil, "snapshot %s: made with %s %s, this node has the older %s (restore needs %d.%d or newer)", id, f.what, f.image, f.node, imaj, imin)
		}
	}
	return nil
}

// majorMinor parses the first "N.M" in s ("6.8.0-31-generic" → 6, 8;
// "Version: 4.0" → 4, 0).
func majorMinor(s string) (major, minor int, ok bool) {
	i := 0
	for i < len(s) && (s[i] < '0' || s[i] > '9') {
		i++
	}
	num := func() (int, bool) {
		j := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		n, err := strconv.Atoi(s[j:i])
		return n, err == nil
	}
	if major, ok = num(); !ok || i >= len(s) || s[i] != '.' {
		return 0, 0, false
	}
	i++
	minor, ok = num()
	return major, minor, ok
}

// Read restores image id into dir, which must exist and be empty, and
// returns its manifest.
//
// Before it fetches any data, Read checks that the manifest hashes to id
// (else ErrCorrupt), that it is signed with key (else ErrBadSignature) and
// that it suits this node (else ErrIncompatible). Then it streams the data
// (download → sha256 → decompress → extract, each stage in its own
// goroutine) into dir, bounded by the sizes the manifest gives, and returns
// nil only once the whole data object matched its size and digest and the
// files matched the manifest. On any failure dir is left empty, and the
// error is ErrTruncated or ErrCorrupt when the data is at fault, or the
// store's, file system's or context's error otherwise. Options:
// WithParallelDownload.
func Read(ctx context.Context, store blob.Store, key *Keyring, id, dir string, compat Compat, opts ...ReadOption) (Manifest, Stats, error) {
	start := time.Now()
	var o readOptions
	for _, opt := range opts {
		opt(&o)
	}
	if key == nil {
		return Manifest{}, Stats{}, errdefs.Invalid("read snapshot: no verification key")
	}
	if err := checkEmptyDir(dir); err != nil {
		return Manifest{}, Stats{}, err
	}
	hexID, err := parseID(id)
	if err != nil {
		return Manifest{}, Stats{}, err
	}
	id = IDPrefix + hexID
	m, err := fetchManifest(ctx, store, hexID)
	if err != nil {
		return Manifest{}, Stats{}, err
	}
	if err := key.VerifyManifest(id, m); err != nil {
		return Manifest{}, Stats{}, err
	}
	if err := m.validate(id); err != nil {
		return Manifest{}, Stats{}, err
	}
	if err := compat.Check(id, m); err != nil {
		return Manifest{}, Stats{}, err
	}
	st, err := readData(ctx, store, id, m, dir, o)
	st.Wall = time.Since(start)
	if err != nil {
		return Manifest{}, st, err
	}
	return m, st, nil
}

// readPipe is the pipeline of one Read.
type readPipe struct {
	body   io.ReadCloser
	down   meter // body reads (the download)
	hash   hash.Hash
	ra1    *readAhead // downloaded, hashed bytes
	decIn  meter      // the decompressor's reads of ra1
	dec    io.ReadCloser
	capped *capReader
	decOut meter      // ra2's reads of the decompressor
	decClk stageClock // the decompressor's busy time
	ra2    *readAhead // decompressed archive bytes
	exIn   meter      // Extract's reads of ra2
	getDur time.Duration
	exDur  time.Duration
}

func readData(ctx context.Context, store blob.Store, id string, m Manifest, dir string, o readOptions) (Stats, error) {
	p := &readPipe{hash: sha256.New()}
	t := time.Now()
	body, err := openData(ctx, store, id, m, o)
	p.getDur = time.Since(t)
	if err != nil {
		return Stats{}, err
	}
	p.body = body
	p.ra1 = newReadAhead(io.TeeReader(meteredReader{r: body, m: &p.down}, p.hash), downloadBuf, downloadDepth)
	p.dec, err = newDecompressor(meteredReader{r: p.ra1, m: &p.decIn, clk: &p.decClk, inner: true}, m.Compression, 0)
	if err != nil {
		body.Close()
		p.ra1.Close()
		return Stats{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	p.capped = &capReader{r: p.dec, left: m.RawSize, id: id}
	p.ra2 = newReadAhead(meteredReader{r: p.capped, m: &p.decOut, clk: &p.decClk}, inflateBuf, inflateDepth)

	var fileBytes int64
	for _, f := range m.Files {
		fileBytes += f.Size
	}
	lim := archive.Limits{
		MaxBytes: max(fileBytes, 1),
		MaxFiles: max(len(m.Files), 1),
		MaxOpen:  min(max(len(m.Files), 1), archive.DefaultMaxOpen),
		// The whole data stream is checked against the signed digest
		// before Read returns; per-file digests would hash it twice.
		SkipFileDigests: true,
	}
	t = time.Now()
	files, err := archive.Extract(ctx, sourceReader{meteredReader{r: p.ra2, m: &p.exIn}}, dir, lim)
	p.exDur = time.Since(t)
	if err == nil {
		err = p.verify(id, m, files)
		if err != nil {
			for _, f := range files {
				os.Remove(filepath.Join(dir, f.Name))
			}
		}
	}
	p.stop()
	st := p.stats()
	if err == nil {
		return st, nil
	}
	return st, p.classify(ctx, id, m, dir, err)
}

// checkEmptyDir fails unless dir is an empty directory: a caller's mistake
// must not look like a corrupt image (callers delete those).
func checkEmptyDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("read snapshot: %w", err)
	}
	defer d.Close()
	names, err := d.Readdirnames(1)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read snapshot into %s: %w", dir, err)
	}
	if len(names) > 0 {
		return errdefs.Invalid(fmt.Sprintf("read snapshot into %s: the directory is not empty (it holds %q): restore into a new, empty directory", dir, names[0]))
	}
	return nil
}

// sourceError marks an error that came out of the data stream (download,
// decompression), as opposed to one from the file system Extract writes to.
type sourceError struct{ err error }

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// sourceReader wraps the stream's errors, but io.EOF, in sourceError.
type sourceReader struct{ r io.Reader }

func (s sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = &sourceError{err}
	}
	return n, err
}

// verify runs after a successful Extract: it reads what is left of the data
// (nothing, normally) and checks the data's size and digest, the archive's
// size and the files against the manifest.
func (p *readPipe) verify(id string, m Manifest, files []archive.FileInfo) error {
	if _, err := io.Copy(io.Discard, p.ra1); err != nil {
		return &sourceError{err}
	}
	got := p.down.bytes.Load()
	if got < m.DataSize {
		return truncated(id, got, m.DataSize)
	}
	if sum := hexSum(p.hash.Sum(nil)); got != m.DataSize || sum != m.DataSHA256 {
		return refuse(ErrCorrupt, nil, "snapshot %s: data does not match the manifest (%d bytes with sha256 %.12s…, want %d bytes with %.12s…): it was modified or damaged", id, got, sum, m.DataSize, m.DataSHA256)
	}
	if p.capped.n != m.RawSize {
		return refuse(ErrCorrupt, nil, "snapshot %s: the archive is %d bytes, the manifest says %d", id, p.capped.n, m.RawSize)
	}
	want := make(map[string]int64, len(m.Files))
	for _, f := range m.Files {
		want[f.Name] = f.Size
	}
	for _, f := range files {
		if size, ok := want[f.Name]; !ok || size != f.Size {
			return refuse(ErrCorrupt, nil, "snapshot %s: file %q (%d bytes) is not in the manifest as such", id, f.Name, f.Size)
		}
	}
	if len(files) != len(m.Files) {
		return refuse(ErrCorrupt, nil, "snapshot %s: %d files came, the manifest lists %d", id, len(files), len(m.Files))
	}
	return nil
}

// stop ends the pipeline's goroutines in an order that unblocks each:
// closing the body ends a pending download read, a closed ra1 fails the
// decompressor's reads, which ends ra2's, and only then is the decompressor,
// which is not safe for concurrent use, closed.
func (p *readPipe) stop() {
	p.body.Close()
	p.ra1.Close()
	p.ra2.Close()
	p.dec.Close()
}

// classify turns a failure into the error Read returns: the context's; the
// file system's (Extract could not write dir); the download's; ErrTruncated
// when the data ended early; else ErrCorrupt.
func (p *readPipe) classify(ctx context.Context, id string, m Manifest, dir string, err error) error {
	if IsRefused(err) {
		return err
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("read snapshot %s: %w", id, cerr)
	}
	var se *sourceError
	if !errors.As(err, &se) && !errors.Is(err, errdefs.ErrInvalid) && !errors.Is(err, errdefs.ErrTooLarge) {
		return fmt.Errorf("snapshot %s: restore into %s: %w", id, dir, err)
	}
	got := p.down.bytes.Load()
	switch srcErr := p.ra1.sourceErr(); {
	case errors.Is(srcErr, io.EOF) && got < m.DataSize:
		return truncated(id, got, m.DataSize)
	case srcErr != nil && !errors.Is(srcErr, io.EOF):
		return fmt.Errorf("snapshot %s: download %s after %d bytes: %w", id, m.DataKey, got, srcErr)
	}
	return refuse(ErrCorrupt, err, "snapshot %s: data does not decode", id)
}

func (p *readPipe) stats() Stats {
	return Stats{
		RawBytes:        p.capped.n,
		CompressedBytes: p.down.bytes.Load(),
		Transfer:        p.getDur + p.down.time(),
		Compress:        p.decClk.busy(),
		Archive:         busy(p.exDur, p.exIn.time()),
	}
}

func truncated(id string, got, want int64) error {
	return refuse(ErrTruncated, nil, "snapshot %s is truncated: got %d of %d bytes", id, got, want)
}

// capReader fails once its source yields more than left bytes: the
// decompressed archive must be exactly as large as the signed manifest
// says, and a decompression bomb must stop there.
type capReader struct {
	r    io.Reader
	left int64
	n    int64
	id   string
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left <= 0 {
		var b [1]byte
		n, err := c.r.Read(b[:])
		if n > 0 {
			return 0, refuse(ErrCorrupt, nil, "snapshot %s: data decompresses to more than the manifest's %d bytes", c.id, c.n)
		}
		return 0, err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	c.n += int64(n)
	return n, err
}
