package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
)

// DefaultChunkSize is the size of one ranged request of a parallel download.
const DefaultChunkSize = 8 << 20

// ReadOption configures Read.
type ReadOption func(*readOptions)

type readOptions struct {
	requests int
	chunk    int64
}

// WithParallelDownload makes Read fetch the data as up to requests ranged
// GETs of chunk bytes (DefaultChunkSize if chunk ≤ 0) in flight at once,
// reassembled in order. One stream from an object store often runs well
// below what the node's network can take; memory stays bounded by about
// (requests+2)·chunk. With requests ≤ 1, or data smaller than two chunks,
// Read uses one plain GET.
func WithParallelDownload(requests int, chunk int64) ReadOption {
	return func(o *readOptions) {
		o.requests = requests
		o.chunk = chunk
		if o.chunk <= 0 {
			o.chunk = DefaultChunkSize
		}
	}
}

// openData opens the data object of m for reading, checking its size
// against the manifest first.
func openData(ctx context.Context, store blob.Store, id string, m Manifest, o readOptions) (io.ReadCloser, error) {
	missing := func(err error) error {
		if errors.Is(err, errdefs.ErrNotFound) {
			return refuse(ErrCorrupt, err, "snapshot %s: its data object %s is missing", id, m.DataKey)
		}
		return fmt.Errorf("snapshot %s: get data: %w", id, err)
	}
	checkSize := func(size int64) error {
		switch {
		case size < 0 || size == m.DataSize:
			return nil
		case size < m.DataSize:
			return truncated(id, size, m.DataSize)
		}
		return refuse(ErrCorrupt, nil, "snapshot %s: its data object is %d bytes, the manifest says %d", id, size, m.DataSize)
	}
	if o.requests > 1 && m.DataSize >= 2*o.chunk {
		info, err := store.Stat(ctx, m.DataKey)
		if err != nil {
			return nil, missing(err)
		}
		if err := checkSize(info.Size); err != nil {
			return nil, err
		}
		return newRangedReader(ctx, store, m.DataKey, m.DataSize, o.chunk, o.requests), nil
	}
	body, info, err := store.Get(ctx, m.DataKey)
	if err != nil {
		return nil, missing(err)
	}
	if err := checkSize(info.Size); err != nil {
		body.Close()
		return nil, err
	}
	return body, nil
}

// rangedReader reads an object of a known size as concurrent GetRange
// requests and yields the bytes in order. The dispatcher queues one result
// channel per chunk, in order, on a channel of capacity requests: that both
// orders the chunks and bounds how many are fetched ahead of the reader.
type rangedReader struct {
	cancel context.CancelFunc
	queue  chan chan rangeResult
	wg     sync.WaitGroup
	cur    []byte
	err    error // to return once cur is consumed
}

type rangeResult struct {
	data []byte
	err  error
}

func newRangedReader(ctx context.Context, store blob.Store, key string, size, chunk int64, requests int) *rangedReader {
	ctx, cancel := context.WithCancel(ctx)
	r := &rangedReader{cancel: cancel, queue: make(chan chan rangeResult, requests-1)}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(r.queue)
		for off := int64(0); off < size; off += chunk {
			n := min(chunk, size-off)
			ch := make(chan rangeResult, 1)
			select {
			case r.queue <- ch:
			case <-ctx.Done():
				return
			}
			r.wg.Add(1)
			go func() {
				defer r.wg.Done()
				ch <- fetchRange(ctx, store, key, off, n)
			}()
		}
	}()
	return r
}

// fetchRange reads n bytes at off. A short object yields what there is
// and io.EOF, so that the reader sees a truncated stream, as with Get.
func fetchRange(ctx context.Context, store blob.Store, key string, off, n int64) rangeResult {
	rc, err := store.GetRange(ctx, key, off, n)
	if errors.Is(err, errdefs.ErrInvalid) {
		return rangeResult{err: io.EOF} // the range starts past the end
	}
	if err != nil {
		return rangeResult{err: fmt.Errorf("get %s bytes %d-%d: %w", key, off, off+n-1, err)}
	}
	defer rc.Close()
	buf := make([]byte, n)
	got, err := io.ReadFull(rc, buf)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return rangeResult{data: buf[:got], err: io.EOF}
	}
	if err != nil {
		return rangeResult{data: buf[:got], err: fmt.Errorf("get %s bytes %d-%d: %w", key, off, off+n-1, err)}
	}
	return rangeResult{data: buf}
}

func (r *rangedReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		ch, ok := <-r.queue
		if !ok {
			r.err = io.EOF
			continue
		}
		res := <-ch
		r.cur, r.err = res.data, res.err
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// Close cancels the requests in flight and waits for them.
func (r *rangedReader) Close() error {
	r.cancel()
	r.wg.Wait()
	return nil
}
