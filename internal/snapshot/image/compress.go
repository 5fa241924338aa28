package image

import (
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/torpor-dev/torpor/internal/errdefs"
)

// zstdMaxWindow bounds the zstd window a decoder accepts. The encoder here
// uses at most 8 MiB; a hostile stream asking for more is refused instead of
// making the decoder allocate it.
const zstdMaxWindow = 64 << 20

// lz4BlockSize is large so that concurrent lz4 compression has big,
// independent units of work.
const lz4BlockSize = lz4.Block4Mb

// checkLevel validates a compression level for c (0 is always the default).
// LZ4 has only its fast mode here: its high-compression mode is
// pathologically slow on repetitive memory pages (level 9 takes seconds per
// MB of a repeated 8-byte pattern); zstd is the codec for ratio.
func checkLevel(c Compression, level int) error {
	max := map[Compression]int{Zstd: 22, LZ4: 0, None: 0}[c]
	if level < 0 || level > max {
		return errdefs.Invalid(fmt.Sprintf("compression level %d is not valid for %s: use 0 (default) to %d", level, c, max))
	}
	return nil
}

// newCompressor returns a writer that compresses into w with codec c, using
// up to concurrency goroutines (0 = GOMAXPROCS). Level 0 is the codec's
// fast default: zstd level 1 ("fastest"), lz4 "fast"; other zstd levels are
// as for the zstd CLI (1–22, mapped to the four speeds the encoder has).
// Close flushes but does not close w.
//
// The lz4 writer leaks a goroutine if writing to w fails before Close; the
// caller's w never fails (see sinkWriter).
func newCompressor(w io.Writer, c Compression, level, concurrency int) (io.WriteCloser, error) {
	if err := checkLevel(c, level); err != nil {
		return nil, err
	}
	switch c {
	case None:
		return nopWriteCloser{w}, nil
	case Zstd:
		lvl := zstd.SpeedFastest
		if level > 0 {
			lvl = zstd.EncoderLevelFromZstd(level)
		}
		n := concurrency
		if n <= 0 {
			n = goMaxProcs()
		}
		// Not WithConcurrentBlocks: on a 2-CPU node it compressed random
		// pages 5x slower than the default stream pipelining (BenchmarkCodec).
		enc, err := zstd.NewWriter(w,
			zstd.WithEncoderLevel(lvl),
			zstd.WithEncoderConcurrency(n),
			zstd.WithEncoderCRC(true))
		if err != nil {
			return nil, fmt.Errorf("zstd encoder: %w", err)
		}
		return enc, nil
	case LZ4:
		lw := lz4.NewWriter(w)
		err := lw.Apply(
			lz4.ConcurrencyOption(concurrency),
			lz4.BlockSizeOption(lz4BlockSize),
			lz4.ChecksumOption(true),
			lz4.CompressionLevelOption(lz4.Fast))
		if err != nil {
			return nil, fmt.Errorf("lz4 encoder: %w", err)
		}
		return lw, nil
	}
	return nil, errdefs.Invalid(fmt.Sprintf("compression %q is not supported: use zstd, lz4 or none", c))
}

// newDecompressor returns a reader of the data r holds compressed with c.
// Close releases the decoder's goroutines; it does not close r.
func newDecompressor(r io.Reader, c Compression, concurrency int) (io.ReadCloser, error) {
	switch c {
	case None:
		return io.NopCloser(r), nil
	case Zstd:
		n := concurrency
		if n <= 0 {
			n = min(goMaxProcs(), 4)
		}
		dec, err := zstd.NewReader(r,
			zstd.WithDecoderConcurrency(n),
			zstd.WithDecoderMaxWindow(zstdMaxWindow),
			zstd.WithDecoderMaxMemory(zstdMaxWindow))
		if err != nil {
			return nil, fmt.Errorf("zstd decoder: %w", err)
		}
		return dec.IOReadCloser(), nil
	case LZ4:
		// One goroutine: the concurrent lz4 reader cannot be stopped half
		// way without leaking its goroutines. (It decodes incompressible
		// data at GB/s, but runs of zeros at only ~400 MB/s, the Go
		// decoder's weak spot; zstd is the better codec for restores.)
		lr := lz4.NewReader(r)
		if err := lr.Apply(lz4.ConcurrencyOption(1)); err != nil {
			return nil, fmt.Errorf("lz4 decoder: %w", err)
		}
		return io.NopCloser(lr), nil
	}
	return nil, errdefs.Invalid(fmt.Sprintf("compression %q is not supported", c))
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
