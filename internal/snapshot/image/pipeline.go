package image

import (
	"context"
	"errors"
	"io"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Stats describes one Write or Read, so that a benchmark can tell which
// stage limits the pipeline. Busy times are wall-clock time a stage spent
// working rather than waiting for its neighbours; the stages overlap, so
// they may add up to more than Wall. With a multi-threaded codec they are
// approximations (the codec's own goroutines are not timed one by one).
type Stats struct {
	// RawBytes is the archive size before compression, CompressedBytes the
	// size of the data object.
	RawBytes        int64
	CompressedBytes int64
	// Wall is the whole call, manifest included.
	Wall time.Duration
	// Archive is Write's produce function with archive encoding, or Read's
	// extraction (archive decoding and file writes).
	Archive time.Duration
	// Compress is compression (Write) or decompression (Read).
	Compress time.Duration
	// Transfer is the upload (Write) or download (Read).
	Transfer time.Duration
}

// MBps returns n bytes over d in MB/s (10^6 bytes), or 0 when d is 0.
func MBps(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / 1e6 / d.Seconds()
}

// ArchiveMBps is the archive stage's throughput over raw bytes.
func (s Stats) ArchiveMBps() float64 { return MBps(s.RawBytes, s.Archive) }

// CompressMBps is the codec's throughput over raw bytes.
func (s Stats) CompressMBps() float64 { return MBps(s.RawBytes, s.Compress) }

// TransferMBps is the store's throughput over compressed bytes.
func (s Stats) TransferMBps() float64 { return MBps(s.CompressedBytes, s.Transfer) }

// WallMBps is the end-to-end throughput over raw bytes.
func (s Stats) WallMBps() float64 { return MBps(s.RawBytes, s.Wall) }

func goMaxProcs() int { return runtime.GOMAXPROCS(0) }

// meter counts the bytes through and the time spent in one side of a stage
// boundary. It is safe for concurrent use.
type meter struct {
	bytes atomic.Int64
	nanos atomic.Int64
}

func (m *meter) add(n int, since time.Time) {
	m.bytes.Add(int64(n))
	m.nanos.Add(int64(time.Since(since)))
}

func (m *meter) time() time.Duration { return time.Duration(m.nanos.Load()) }

// busy returns outer minus inner, never less than 0: the time a stage spent
// in itself, not in the stage it called.
func busy(outer, inner time.Duration) time.Duration { return max(outer-inner, 0) }

// stageClock measures the busy time of a stage whose work runs in
// goroutines of its own (a concurrent codec): the time callers spent inside
// the stage (outer calls) less the part of it during which the stage was
// itself waiting on the next one (inner calls). Timing calls one by one
// cannot do that: the codec's waits and its callers' waits overlap but do
// not nest.
type stageClock struct {
	mu           sync.Mutex
	outer, inner int
	last         time.Time
	inside, both time.Duration
}

func (c *stageClock) enter(inner bool) { c.step(inner, 1) }
func (c *stageClock) exit(inner bool)  { c.step(inner, -1) }

func (c *stageClock) step(inner bool, d int) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	if c.outer > 0 {
		c.inside += now.Sub(c.last)
		if c.inner > 0 {
			c.both += now.Sub(c.last)
		}
	}
	c.last = now
	if inner {
		c.inner += d
	} else {
		c.outer += d
	}
}

// busy is the time callers were inside the stage while it was not waiting.
func (c *stageClock) busy() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return busy(c.inside, c.both)
}

// meteredWriter times and counts the writes to w, failing them once ctx is
// done (so that a cancelled Write stops at the next write). If clk is set,
// the writes are clk's outer (or inner) calls.
type meteredWriter struct {
	ctx   context.Context
	w     io.Writer
	m     *meter
	clk   *stageClock
	inner bool
}

func (w meteredWriter) Write(p []byte) (int, error) {
	if w.ctx != nil {
		if err := w.ctx.Err(); err != nil {
			return 0, context.Cause(w.ctx)
		}
	}
	w.clk.enter(w.inner)
	t := time.Now()
	n, err := w.w.Write(p)
	w.m.add(n, t)
	w.clk.exit(w.inner)
	return n, err
}

// meteredReader times and counts the reads from r, as meteredWriter.
type meteredReader struct {
	r     io.Reader
	m     *meter
	clk   *stageClock
	inner bool
}

func (r meteredReader) Read(p []byte) (int, error) {
	r.clk.enter(r.inner)
	t := time.Now()
	n, err := r.r.Read(p)
	r.m.add(n, t)
	r.clk.exit(r.inner)
	return n, err
}

// errReadAheadClosed is what a stopped readAhead yields.
var errReadAheadClosed = errors.New("read-ahead stopped")

// readAhead reads its source in a goroutine of its own into a few buffers,
// so that the stages before and after it run in parallel (download while
// decompressing, decompress while writing files). Read is for one goroutine.
type readAhead struct {
	src    io.Reader
	full   chan []byte
	free   chan []byte
	done   chan struct{}
	exited chan struct{}
	stop   sync.Once
	err    error // the source's final error; read only after full is closed
	cur    []byte
	off    int
}

// newReadAhead starts reading src with depth buffers of size bytes.
func newReadAhead(src io.Reader, size, depth int) *readAhead {
	ra := &readAhead{
		src:    src,
		full:   make(chan []byte, depth),
		free:   make(chan []byte, depth),
		done:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	for range depth {
		ra.free <- make([]byte, size)
	}
	go ra.run()
	return ra
}

func (ra *readAhead) run() {
	defer close(ra.exited)
	defer close(ra.full)
	for {
		var buf []byte
		select {
		case buf = <-ra.free:
		case <-ra.done:
			return
		}
		n, err := ra.src.Read(buf[:cap(buf)])
		if n > 0 {
			select {
			case ra.full <- buf[:n]:
			case <-ra.done:
				return
			}
		} else {
			ra.free <- buf
		}
		if err != nil {
			ra.err = err
			return
		}
	}
}

func (ra *readAhead) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if ra.off == len(ra.cur) {
		if ra.cur != nil {
			ra.free <- ra.cur[:cap(ra.cur)] // never blocks: there are only depth buffers
			ra.cur, ra.off = nil, 0
		}
		buf, ok := <-ra.full
		if !ok {
			if ra.err == nil {
				return 0, errReadAheadClosed
			}
			return 0, ra.err
		}
		ra.cur, ra.off = buf, 0
	}
	n := copy(p, ra.cur[ra.off:])
	ra.off += n
	return n, nil
}

// Close stops the goroutine and waits for it. If it is blocked reading the
// source, Close waits until that read returns: close the source first.
func (ra *readAhead) Close() {
	ra.stop.Do(func() { close(ra.done) })
	<-ra.exited
}

// sourceErr returns the source's final error (io.EOF at a clean end), or nil
// if the goroutine stopped without one. Call it after Close.
func (ra *readAhead) sourceErr() error { return ra.err }
