package blobtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// writers is how many goroutines write at once in testConcurrent.
const writers = 16

// testConcurrent races writers on their own keys and on one shared key, a
// reader on the shared key, and Put/Delete churn in one directory (where a
// local store removes and recreates directories under each other's feet).
func testConcurrent(t *testing.T, s blob.Store) {
	ctx := testenv.Ctx(t)
	own := make([][]byte, writers)
	same := make([][]byte, writers)
	sameSums := map[[32]byte]int{}
	for i := range writers {
		own[i] = random(uint64(100+i), 64<<10+i*1000)
		same[i] = random(uint64(200+i), 32<<10+i*777)
		sameSums[sha256.Sum256(same[i])] = i
	}

	var wg sync.WaitGroup
	done := make(chan struct{})
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for reads := 0; ; reads++ {
			select {
			case <-done:
				return
			default:
			}
			rc, info, err := s.Get(ctx, "conc/same")
			if errors.Is(err, errdefs.ErrNotFound) {
				continue
			}
			if err != nil {
				t.Errorf("Get conc/same during writes: %v", err)
				return
			}
			b, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Errorf("read conc/same during writes: %v", err)
				return
			}
			if _, ok := sameSums[sha256.Sum256(b)]; !ok || info.Size != int64(len(b)) {
				t.Errorf("Get conc/same during writes: %d bytes (Info.Size %d) that no single writer wrote", len(b), info.Size)
				return
			}
		}
	}()
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			size := int64(-1)
			if i%2 == 0 {
				size = int64(len(own[i]))
			}
			if _, err := s.Put(ctx, fmt.Sprintf("conc/own/%02d", i), &chunkReader{r: bytes.NewReader(own[i]), max: 4096 + i}, size); err != nil {
				t.Errorf("writer %d: Put own key: %v", i, err)
			}
			if _, err := s.Put(ctx, "conc/same", bytes.NewReader(same[i]), int64(len(same[i]))); err != nil {
				t.Errorf("writer %d: Put shared key: %v", i, err)
			}
			for j := range 10 {
				key := fmt.Sprintf("conc/churn/d/%02d", i)
				if _, err := s.Put(ctx, key, bytes.NewReader([]byte{byte(j)}), 1); err != nil {
					t.Errorf("writer %d: churn Put %d: %v", i, j, err)
					return
				}
				if err := s.Delete(ctx, key); err != nil {
					t.Errorf("writer %d: churn Delete %d: %v", i, j, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	<-readerDone
	if t.Failed() {
		return
	}

	for i := range writers {
		equal(t, s, fmt.Sprintf("conc/own/%02d", i), own[i])
	}
	rc, _, err := s.Get(ctx, "conc/same")
	if err != nil {
		t.Fatalf("Get conc/same: %v", err)
	}
	b := readAll(t, rc)
	i, ok := sameSums[sha256.Sum256(b)]
	if !ok {
		t.Fatalf("conc/same holds %d bytes that no single writer wrote", len(b))
	}
	equal(t, s, "conc/same", same[i])
	if list := mustList(t, s, "conc/"); len(list) != writers+1 {
		t.Errorf("List(conc/) has %d objects, want %d", len(list), writers+1)
	}
}

// errBroken is the failure of a brokenReader.
var errBroken = errors.New("source broke")

// testInterrupted checks that a Put whose stream fails or whose context is
// cancelled part way stores nothing: a new key stays absent, an existing
// one keeps its old content. Each case gets its own store, so that the
// backend's cleanup checks (no temp files, no multipart uploads) run after
// each.
func testInterrupted(t *testing.T, newStore func(t *testing.T) blob.Store) {
	for _, tc := range []struct {
		name   string
		at     int  // bytes served before the failure
		sized  bool // whether Put is told a (larger) size
		cancel bool // cancel the context instead of failing the read
	}{
		{"read-error-early", 1000, false, false},
		{"read-error-early-sized", 1000, true, false},
		{"read-error-at-zero", 0, false, false},
		{"read-error-after-parts", 12 << 20, false, false},
		{"read-error-after-parts-sized", 12 << 20, true, false},
		{"read-error-at-part-boundary", 10 << 20, false, false},
		{"cancel-early", 1000, false, true},
		{"cancel-after-parts", 12 << 20, false, true},
		{"cancel-after-parts-sized", 12 << 20, true, true},
	} {
		for _, existing := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/existing=%v", tc.name, existing), func(t *testing.T) {
				s := newStore(t)
				key := "int/" + tc.name
				old := []byte("the old version")
				if existing {
					put(t, s, key, old, int64(len(old)))
				}
				ctx, cancel := context.WithCancel(testenv.Ctx(t))
				defer cancel()
				r := &brokenReader{data: random(9, tc.at), cancel: nil}
				if tc.cancel {
					r.cancel = cancel
				}
				size := int64(-1)
				if tc.sized {
					size = int64(2*tc.at + 1)
				}
				_, err := s.Put(ctx, key, r, size)
				switch {
				case err == nil:
					t.Errorf("Put of an interrupted stream succeeded")
				case tc.cancel && !errors.Is(err, context.Canceled):
					t.Errorf("Put with the context cancelled part way: %v, want context.Canceled", err)
				case !tc.cancel && !errors.Is(err, errBroken):
					t.Errorf("Put of a stream that broke: %v, want the stream's error", err)
				}
				if existing {
					equal(t, s, key, old)
				} else {
					absent(t, s, key)
				}
			})
		}
	}
}

// brokenReader serves data, then either fails with errBroken or, if cancel
// is set, cancels the Put's context and goes on serving (up to a bound, so
// that a store that ignores the context ends instead of hanging).
type brokenReader struct {
	data   []byte
	off    int
	cancel context.CancelFunc
	extra  int
}

// maxExtra bounds what a brokenReader serves after cancelling.
const maxExtra = 40 << 20

func (r *brokenReader) Read(p []byte) (int, error) {
	if r.off < len(r.data) {
		n := copy(p, r.data[r.off:])
		r.off += n
		return n, nil
	}
	if r.cancel == nil {
		return 0, errBroken
	}
	r.cancel()
	if r.extra >= maxExtra {
		return 0, io.EOF
	}
	n := min(len(p), maxExtra-r.extra)
	clear(p[:n])
	r.extra += n
	return n, nil
}
