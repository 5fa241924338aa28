package image

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/snapshot/archive"
)

// cleanupTimeout bounds the deletion of a half-written image, which runs
// even when the caller's context is already cancelled.
const cleanupTimeout = 30 * time.Second

// WriteOptions configure Write.
type WriteOptions struct {
	// Compression is the codec (default Zstd).
	Compression Compression
	// Level is the codec's level; 0 is its fast default. Zstd takes 1–22 as
	// the zstd CLI does; LZ4 and None take only 0.
	Level int
	// Concurrency bounds the compressor's goroutines; 0 means 1: the
	// compressor then runs inside the pipeline's own stage (the dump, the
	// compression and the upload already overlap), uses the least memory,
	// and its busy time in Stats is exact. (An asynchronous encoder's output
	// overlaps its input, which the stage clock cannot tell apart.)
	Concurrency int
	// Manifest is the template of the manifest: Write keeps Function,
	// FunctionVersion, Runtime, CRIUVersion, Kernel, Arch (default
	// runtime.GOARCH), CreatedAt (default now), MemoryBytes and Labels, and
	// fills in everything else. Runtime, CRIUVersion and Kernel are
	// required: Read checks them before restoring.
	Manifest Manifest
	// Logger receives what cannot be returned (a failed clean-up); nil
	// discards it.
	Logger *slog.Logger
}

// template returns the manifest Write starts from.
func (o WriteOptions) template() (Manifest, error) {
	t := o.Manifest
	for _, f := range []struct{ name, v string }{
		{"Runtime", t.Runtime}, {"CRIUVersion", t.CRIUVersion}, {"Kernel", t.Kernel},
	} {
		if strings.TrimSpace(f.v) == "" {
			return Manifest{}, errdefs.Invalid(fmt.Sprintf("write snapshot: WriteOptions.Manifest.%s is empty: set it to this node's value, Read needs it to check compatibility", f.name))
		}
	}
	m := Manifest{
		Format:          FormatVersion,
		Function:        t.Function,
		FunctionVersion: t.FunctionVersion,
		Runtime:         t.Runtime,
		CRIUVersion:     t.CRIUVersion,
		Kernel:          t.Kernel,
		Arch:            t.Arch,
		CreatedAt:       t.CreatedAt,
		Compression:     o.Compression,
		MemoryBytes:     t.MemoryBytes,
		Labels:          maps.Clone(t.Labels),
	}
	if m.Arch == "" {
		m.Arch = runtime.GOARCH
	}
	if m.CreatedAt.IsZero() {
		m.CreatedAt = time.Now()
	}
	m.CreatedAt = m.CreatedAt.UTC().Round(0)
	if m.Compression == "" {
		m.Compression = Zstd
	}
	if !m.Compression.valid() {
		return Manifest{}, errdefs.Invalid(fmt.Sprintf("write snapshot: compression %q is not supported: use zstd, lz4 or none", m.Compression))
	}
	if err := checkLevel(m.Compression, o.Level); err != nil {
		return Manifest{}, fmt.Errorf("write snapshot: %w", err)
	}
	return m, nil
}

// Write stores a new image and returns its ID, manifest and stats.
//
// produce writes the image files into the archive writer it is given (it
// may create several files and write them from several goroutines, but must
// close them all before it returns) and should stop when ctx is cancelled.
// Its output is archived, compressed, hashed and uploaded as it is written,
// into a data object under a random name; then the signed manifest is
// stored, which commits the image. If produce, the upload or anything else
// fails, or ctx is cancelled, the data object is deleted and no manifest is
// written: no half image is ever visible.
func Write(ctx context.Context, store blob.Store, key *Keyring, opts WriteOptions, produce func(ctx context.Context, w *archive.Writer) error) (string, Manifest, Stats, error) {
	start := time.Now()
	if key == nil || produce == nil {
		return "", Manifest{}, Stats{}, errdefs.Invalid("write snapshot: no signing key or no produce function")
	}
	m, err := opts.template()
	if err != nil {
		return "", Manifest{}, Stats{}, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m.DataKey = DataPrefix + randomHex()

	p, err := startWrite(ctx, store, m.DataKey, m.Compression, opts.Level, max(opts.Concurrency, 1))
	if err != nil {
		return "", Manifest{}, Stats{}, err
	}
	defer p.cancel(nil)
	files, err := p.run(produce)
	st := p.stats()
	if err != nil {
		p.discard(log)
		return "", Manifest{}, st, fmt.Errorf("write snapshot of %s: %w", m.Function, err)
	}

	m.DataSize = st.CompressedBytes
	m.DataSHA256 = hexSum(p.sum)
	m.RawSize = st.RawBytes
	m.Files = make([]FileEntry, 0, len(files))
	for _, f := range files {
		m.Files = append(m.Files, FileEntry{Name: f.Name, Size: f.Size})
	}
	slices.SortFunc(m.Files, func(a, b FileEntry) int { return strings.Compare(a.Name, b.Name) })
	stored, id, err := key.SignManifest(&m)
	if err == nil {
		_, err = store.Put(ctx, manifestKey(strings.TrimPrefix(id, IDPrefix)), bytes.NewReader(stored), int64(len(stored)))
	}
	if err != nil {
		p.discard(log)
		return "", Manifest{}, st, fmt.Errorf("write snapshot of %s: store manifest: %w", m.Function, err)
	}
	st.Wall = time.Since(start)
	return id, m, st, nil
}

// randomHex returns 128 random bits as hex, the name of a data object.
func randomHex() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return hex.EncodeToString(b[:])
}

// writePipe is one Write's pipeline: archive writer → compressor → pipe →
// store.Put in a goroutine, which hashes and counts what it reads.
type writePipe struct {
	parent  context.Context
	ctx     context.Context
	cancel  context.CancelCauseFunc
	store   blob.Store
	dataKey string
	pw      *io.PipeWriter
	sink    *sinkWriter
	comp    io.WriteCloser
	aw      *archive.Writer

	raw     meter      // archive → compressor
	compOut meter      // compressor → pipe
	compClk stageClock // the compressor's busy time
	upRead  meter      // Put ← pipe, as read by Put
	produce time.Duration
	upDur   time.Duration
	sum     []byte
	upload  chan uploadResult
}

type uploadResult struct {
	info blob.Info
	err  error
	dur  time.Duration
	sum  []byte
}

func startWrite(ctx context.Context, store blob.Store, dataKey string, c Compression, level, concurrency int) (*writePipe, error) {
	parent := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	pr, pw := io.Pipe()
	p := &writePipe{parent: parent, ctx: ctx, cancel: cancel, store: store, dataKey: dataKey, pw: pw, upload: make(chan uploadResult, 1)}
	p.sink = &sinkWriter{w: pw, m: &p.compOut, clk: &p.compClk}
	comp, err := newCompressor(p.sink, c, level, concurrency)
	if err != nil {
		cancel(err)
		return nil, fmt.Errorf("write snapshot: %w", err)
	}
	p.comp = comp
	p.aw = archive.NewWriter(meteredWriter{ctx: ctx, w: comp, m: &p.raw, clk: &p.compClk})
	// The whole data object is digested and the digest signed: per-file
	// digests would hash every byte a second time for nothing.
	p.aw.SkipDigests()
	go func() {
		t := time.Now()
		h := sha256.New()
		info, err := store.Put(ctx, dataKey, meteredReader{r: io.TeeReader(pr, h), m: &p.upRead}, -1)
		if err != nil {
			err = fmt.Errorf("upload snapshot data %s: %w", dataKey, err)
			cancel(err)
		}
		// Unblock the compressor whatever happened: after Put returns,
		// nobody reads the pipe.
		pr.CloseWithError(errors.Join(err, errors.New("snapshot upload ended")))
		p.upload <- uploadResult{info: info, err: err, dur: time.Since(t), sum: h.Sum(nil)}
	}()
	return p, nil
}

// run runs produce and finishes the stream; it returns the archived files
// once the data object is stored, or the first error.
func (p *writePipe) run(produce func(ctx context.Context, w *archive.Writer) error) ([]archive.FileInfo, error) {
	t := time.Now()
	err := produce(p.ctx, p.aw)
	if err == nil {
		err = p.aw.Close()
	}
	p.produce = time.Since(t)
	if err != nil {
		return nil, p.abort(err)
	}
	p.compClk.enter(false)
	err = p.comp.Close()
	p.compClk.exit(false)
	if err != nil {
		return nil, p.abort(fmt.Errorf("compress: %w", err))
	}
	if err := p.sink.failed(); err != nil {
		return nil, p.abort(err)
	}
	p.pw.Close()
	up := <-p.upload
	p.upDur, p.sum = up.dur, up.sum
	if up.err != nil {
		return nil, up.err
	}
	sent, got := p.compOut.bytes.Load(), p.upRead.bytes.Load()
	if sent != got || (up.info.Size >= 0 && up.info.Size != sent) {
		return nil, fmt.Errorf("upload snapshot data %s: the store kept %d bytes of the %d sent (it read %d): %w", p.dataKey, up.info.Size, sent, got, errdefs.ErrUnavailable)
	}
	return p.aw.Files(), nil
}

// abort stops the pipeline after err: the upload fails (so nothing is
// stored), the compressor is closed into the void (so its goroutines end),
// and the error to report is returned.
func (p *writePipe) abort(err error) error {
	p.cancel(err)
	p.sink.fail(err)
	p.pw.CloseWithError(err)
	p.comp.Close()
	up := <-p.upload
	p.upDur = up.dur
	return p.rootCause(err, up.err)
}

// rootCause picks the error to report when the pipeline failed with err:
// the upload's, if it failed first (err is then only its echo downstream);
// the caller's cancellation, if that was it; else err.
func (p *writePipe) rootCause(err, upErr error) error {
	if upErr != nil && context.Cause(p.ctx) == upErr {
		return upErr
	}
	if perr := p.parent.Err(); perr != nil && !errors.Is(err, perr) {
		return fmt.Errorf("%w: %w", perr, err)
	}
	return err
}

func (p *writePipe) stats() Stats {
	return Stats{
		RawBytes:        p.raw.bytes.Load(),
		CompressedBytes: p.compOut.bytes.Load(),
		Archive:         busy(p.produce, p.raw.time()),
		Compress:        p.compClk.busy(),
		Transfer:        busy(p.upDur, p.upRead.time()),
	}
}

// sinkWriter is where the compressor writes: the pipe to the upload. It
// never fails: after the first error (or fail) it discards, so that a
// compressor is never left half-failed (the lz4 writer then leaks its
// goroutines); the error reaches the producer through the cancelled
// context instead, and Write through failed.
type sinkWriter struct {
	w   io.Writer
	m   *meter
	clk *stageClock
	mu  sync.Mutex
	err error
}

func (s *sinkWriter) Write(p []byte) (int, error) {
	if s.failed() != nil {
		return len(p), nil
	}
	s.clk.enter(true)
	t := time.Now()
	n, err := s.w.Write(p)
	s.m.add(n, t)
	s.clk.exit(true)
	if err != nil {
		s.fail(err)
	}
	return len(p), nil
}

func (s *sinkWriter) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

func (s *sinkWriter) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// discard deletes the data object, with a context of its own: the caller's
// may be what was cancelled. A failure is logged; GC removes what is left.
func (p *writePipe) discard(log *slog.Logger) {
	p.cancel(errors.New("snapshot write abandoned"))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(p.ctx), cleanupTimeout)
	defer cancel()
	if err := p.store.Delete(ctx, p.dataKey); err != nil {
		log.Warn("delete data of failed snapshot write; GC will remove it", "key", p.dataKey, "err", err)
	}
}
