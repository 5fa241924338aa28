// Package blobtest is the one conformance suite of blob.Store: every backend
// runs Run from its own tests, so that all of them keep the same contract
// (atomic Puts, ranges, error classes, sorted lists). It is imported only by
// tests, and checks behaviour through the interface alone; a backend checks
// what only it can see (temp files, leftover multipart uploads) in the
// t.Cleanup of its newStore.
package blobtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/testenv"
)

// LargeSize is the size of the large objects the suite stores: more than
// four parts of 5 MiB, the smallest part size S3 allows, so that a backend
// tested with 5 MiB parts uploads several in parallel and a last short one.
const LargeSize = 23 << 20

// Run runs the suite. newStore returns an empty store for one subtest; it
// may register t.Cleanup functions, which run when that subtest ends, to
// check the backend's own invariants after each of them.
func Run(t *testing.T, newStore func(t *testing.T) blob.Store) {
	t.Run("PutGetStatDelete", func(t *testing.T) { testBasic(t, newStore(t)) })
	t.Run("Overwrite", func(t *testing.T) { testOverwrite(t, newStore(t)) })
	t.Run("Sizes", func(t *testing.T) { testSizes(t, newStore(t)) })
	t.Run("SizeMismatch", func(t *testing.T) { testSizeMismatch(t, newStore(t)) })
	t.Run("Large", func(t *testing.T) { testLarge(t, newStore(t)) })
	t.Run("Range", func(t *testing.T) { testRange(t, newStore(t)) })
	t.Run("Missing", func(t *testing.T) { testMissing(t, newStore(t)) })
	t.Run("InvalidKeys", func(t *testing.T) { testInvalidKeys(t, newStore(t)) })
	t.Run("List", func(t *testing.T) { testList(t, newStore(t)) })
	t.Run("KeyIsParentOfKey", func(t *testing.T) { testParentKey(t, newStore(t)) })
	t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, newStore(t)) })
	t.Run("Interrupted", func(t *testing.T) { testInterrupted(t, newStore) })
	t.Run("CancelledContext", func(t *testing.T) { testCancelled(t, newStore(t)) })
}

func testBasic(t *testing.T, s blob.Store) {
	ctx := testenv.Ctx(t)
	key, data := "fn/v1/snap-1/pages.img", []byte("hello, snapshot")
	info := put(t, s, key, data, int64(len(data)))
	if info.Key != key || info.Size != int64(len(data)) {
		t.Errorf("Put = %+v, want key %s size %d", info, key, len(data))
	}
	checkModTime(t, "Put", info.ModTime)
	st, err := s.Stat(ctx, key)
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	if st.Key != key || st.Size != int64(len(data)) {
		t.Errorf("Stat = %+v, want key %s size %d", st, key, len(data))
	}
	checkModTime(t, "Stat", st.ModTime)
	rc, gi, err := s.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	got := readAll(t, rc)
	if !bytes.Equal(got, data) || gi.Key != key || gi.Size != int64(len(data)) {
		t.Errorf("Get = %q %+v, want %q size %d", got, gi, data, len(data))
	}
	checkModTime(t, "Get", gi.ModTime)
	if err := s.Delete(ctx, key); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	absent(t, s, key)
	if err := s.Delete(ctx, key); err != nil {
		t.Errorf("Delete of a deleted key: %v, want nil", err)
	}
	// The store is reusable after its directories (if any) were emptied.
	put(t, s, key, data, -1)
	equal(t, s, key, data)
}

func testOverwrite(t *testing.T, s blob.Store) {
	key := "over/write"
	put(t, s, key, bytes.Repeat([]byte("first version "), 1000), -1)
	second := []byte("second")
	put(t, s, key, second, int64(len(second)))
	equal(t, s, key, second)
	list := mustList(t, s, "")
	if len(list) != 1 || list[0].Key != key || list[0].Size != int64(len(second)) {
		t.Errorf("List after overwrite = %+v, want one %s of %d bytes", list, key, len(second))
	}
}

func testSizes(t *testing.T, s blob.Store) {
	for _, n := range []int{0, 1, 4096, 1<<20 + 3} {
		for _, known := range []bool{true, false} {
			name := fmt.Sprintf("%d-known-%v", n, known)
			t.Run(name, func(t *testing.T) {
				data := random(uint64(n), n)
				size := int64(-1)
				if known {
					size = int64(n)
				}
				key := "sizes/" + name
				info := put(t, s, key, data, size)
				if info.Size != int64(n) {
					t.Errorf("Put size = %d, want %d", info.Size, n)
				}
				equal(t, s, key, data)
			})
		}
	}
}

func testSizeMismatch(t *testing.T, s blob.Store) {
	for _, tc := range []struct {
		name       string
		size, have int
	}{
		{"short", 100, 50},
		{"long", 50, 100},
		{"empty-but-sized", 10, 0},
		{"large-short", 12 << 20, 11 << 20},
		{"large-long", 6 << 20, 12 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "mismatch/" + tc.name
			_, err := s.Put(testenv.Ctx(t), key, bytes.NewReader(random(1, tc.have)), int64(tc.size))
			wantClass(t, "Put with a wrong size", err, errdefs.ErrInvalid)
			absent(t, s, key)
		})
	}
}

func testLarge(t *testing.T, s blob.Store) {
	data := random(23, LargeSize)
	for _, known := range []bool{true, false} {
		t.Run(fmt.Sprintf("known=%v", known), func(t *testing.T) {
			ctx := testenv.Ctx(t)
			size := int64(-1)
			if known {
				size = LargeSize
			}
			key := fmt.Sprintf("large/%v.img", known)
			// Odd-sized reads, so that no part boundary meets a Read's.
			info, err := s.Put(ctx, key, &chunkReader{r: bytes.NewReader(data), max: 1<<20 + 17}, size)
			if err != nil {
				t.Fatalf("Put: %v", err)
			}
			if info.Size != LargeSize {
				t.Errorf("Put size = %d, want %d", info.Size, LargeSize)
			}
			rc, gi, err := s.Get(ctx, key)
			if err != nil {
				t.Fatalf("Get: %v", err)
			}
			h := sha256.New()
			n, err := io.Copy(h, rc)
			rc.Close()
			if err != nil || n != LargeSize || gi.Size != LargeSize {
				t.Fatalf("Get read %d bytes (Info.Size %d), err %v; want %d", n, gi.Size, err, LargeSize)
			}
			if got, want := h.Sum(nil), sha256.Sum256(data); !bytes.Equal(got, want[:]) {
				t.Errorf("Get sha256 = %x, want %x", got, want)
			}
			// A range across the 5 MiB and 8 MiB part boundaries.
			off := int64(5<<20 - 1000)
			rangeEqual(t, s, key, off, 4<<20, data[off:off+4<<20])
		})
	}
}

func testRange(t *testing.T, s blob.Store) {
	data := random(7, 1000)
	put(t, s, "r/obj", data, int64(len(data)))
	put(t, s, "r/empty", nil, 0)
	for _, tc := range []struct {
		key         string
		off, length int64
		want        []byte // nil with bad: an ErrInvalid error
		bad         bool
	}{
		{"r/obj", 0, 10, data[:10], false},
		{"r/obj", 500, 100, data[500:600], false},
		{"r/obj", 990, -1, data[990:], false},
		{"r/obj", 990, 10, data[990:], false},
		{"r/obj", 0, -1, data, false},
		{"r/obj", 0, 1000, data, false},
		{"r/obj", 999, 1, data[999:], false},
		{"r/obj", 1000, -1, []byte{}, false},
		{"r/obj", 1000, 0, []byte{}, false},
		{"r/obj", 10, 0, []byte{}, false},
		{"r/obj", 1001, -1, nil, true},
		{"r/obj", 990, 11, nil, true},
		{"r/obj", 0, 1001, nil, true},
		{"r/obj", 2000, 1, nil, true},
		{"r/obj", -1, 5, nil, true},
		{"r/empty", 0, -1, []byte{}, false},
		{"r/empty", 0, 0, []byte{}, false},
		{"r/empty", 0, 1, nil, true},
		{"r/empty", 1, -1, nil, true},
	} {
		t.Run(fmt.Sprintf("%s@%d+%d", tc.key, tc.off, tc.length), func(t *testing.T) {
			if tc.bad {
				rc, err := s.GetRange(testenv.Ctx(t), tc.key, tc.off, tc.length)
				if err == nil {
					rc.Close()
				}
				wantClass(t, "GetRange", err, errdefs.ErrInvalid)
				return
			}
			rangeEqual(t, s, tc.key, tc.off, tc.length, tc.want)
		})
	}
}

func testMissing(t *testing.T, s blob.Store) {
	ctx := testenv.Ctx(t)
	put(t, s, "m/file", []byte("x"), 1)
	put(t, s, "m/dir/obj", []byte("y"), 1)
	for _, key := range []string{"nothing", "m/none", "m/file/below", "m/dir", "m/di"} {
		t.Run(key, func(t *testing.T) {
			_, err := s.Stat(ctx, key)
			wantClass(t, "Stat", err, errdefs.ErrNotFound)
			rc, _, err := s.Get(ctx, key)
			if err == nil {
				rc.Close()
			}
			wantClass(t, "Get", err, errdefs.ErrNotFound)
			rc, err = s.GetRange(ctx, key, 0, 1)
			if err == nil {
				rc.Close()
			}
			wantClass(t, "GetRange", err, errdefs.ErrNotFound)
			if err := s.Delete(ctx, key); err != nil {
				t.Errorf("Delete of a missing key: %v, want nil", err)
			}
		})
	}
	// Deleting what is not an object left the objects beside it.
	equal(t, s, "m/file", []byte("x"))
	equal(t, s, "m/dir/obj", []byte("y"))
}

func testInvalidKeys(t *testing.T, s blob.Store) {
	ctx := testenv.Ctx(t)
	for _, key := range []string{
		"", "../x", "a/../../x", "/abs", "a//b", "a b", "./a", "a/.", "a/", "a\\b", "a:b", "é", "a\x00b",
		strings.Repeat("k", blob.MaxKeyLen+1),
	} {
		t.Run(fmt.Sprintf("%.20q", key), func(t *testing.T) {
			_, err := s.Put(ctx, key, strings.NewReader("x"), 1)
			wantClass(t, "Put", err, errdefs.ErrInvalid)
			rc, _, err := s.Get(ctx, key)
			if err == nil {
				rc.Close()
			}
			wantClass(t, "Get", err, errdefs.ErrInvalid)
			rc, err = s.GetRange(ctx, key, 0, 1)
			if err == nil {
				rc.Close()
			}
			wantClass(t, "GetRange", err, errdefs.ErrInvalid)
			_, err = s.Stat(ctx, key)
			wantClass(t, "Stat", err, errdefs.ErrInvalid)
			wantClass(t, "Delete", s.Delete(ctx, key), errdefs.ErrInvalid)
		})
	}
	for _, prefix := range []string{"../", "/abs", "/", "a//", "a b", "./", "a/../", "a/./b"} {
		_, err := s.List(ctx, prefix)
		wantClass(t, fmt.Sprintf("List(%q)", prefix), err, errdefs.ErrInvalid)
	}
	if list := mustList(t, s, ""); len(list) != 0 {
		t.Errorf("invalid keys stored objects: %+v", list)
	}
}

func testList(t *testing.T, s blob.Store) {
	if list := mustList(t, s, ""); len(list) != 0 {
		t.Fatalf("List of a new store = %+v, want none", list)
	}
	keys := []string{"l/ab", "l/a/b", "l/a.b", "l/a-b", "l/b/c/d", "l/z", "l2/z", "m/x", "top"}
	for i, k := range keys {
		put(t, s, k, bytes.Repeat([]byte{'x'}, i), int64(i))
	}
	for _, tc := range []struct {
		prefix string
		want   []string
	}{
		{"", []string{"l/a-b", "l/a.b", "l/a/b", "l/ab", "l/b/c/d", "l/z", "l2/z", "m/x", "top"}},
		{"l", []string{"l/a-b", "l/a.b", "l/a/b", "l/ab", "l/b/c/d", "l/z", "l2/z"}},
		{"l/", []string{"l/a-b", "l/a.b", "l/a/b", "l/ab", "l/b/c/d", "l/z"}},
		{"l/a", []string{"l/a-b", "l/a.b", "l/a/b", "l/ab"}},
		{"l/a/", []string{"l/a/b"}},
		{"l/b/c/", []string{"l/b/c/d"}},
		{"l/b/c/d", []string{"l/b/c/d"}},
		{"l/b/c/d/", nil},
		{"l/b/c/dd", nil},
		{"nope/", nil},
		{"nope", nil},
		{"to", []string{"top"}},
	} {
		t.Run(fmt.Sprintf("%q", tc.prefix), func(t *testing.T) {
			list := mustList(t, s, tc.prefix)
			var got []string
			for _, in := range list {
				got = append(got, in.Key)
				if want := int64(indexOf(keys, in.Key)); in.Size != want {
					t.Errorf("List size of %s = %d, want %d", in.Key, in.Size, want)
				}
				checkModTime(t, "List "+in.Key, in.ModTime)
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
			}
		})
	}
}

// testParentKey stores keys of which one is a parent path of the other. An
// object store keeps both; a file system cannot, and must refuse the second
// with ErrConflict while keeping the first intact.
func testParentKey(t *testing.T, s blob.Store) {
	ctx := testenv.Ctx(t)
	for _, tc := range []struct{ first, second string }{
		{"p/file", "p/file/child"},
		{"q/dir/child", "q/dir"},
	} {
		put(t, s, tc.first, []byte("first"), -1)
		_, err := s.Put(ctx, tc.second, strings.NewReader("second"), -1)
		switch {
		case err == nil:
			equal(t, s, tc.second, []byte("second"))
		case errors.Is(err, errdefs.ErrConflict):
			absent(t, s, tc.second)
		default:
			t.Errorf("Put %s beside %s: %v, want nil or ErrConflict", tc.second, tc.first, err)
		}
		equal(t, s, tc.first, []byte("first"))
	}
}

func testCancelled(t *testing.T, s blob.Store) {
	put(t, s, "c/there", []byte("kept"), -1)
	ctx, cancel := context.WithCancel(testenv.Ctx(t))
	cancel()
	_, err := s.Put(ctx, "c/new", strings.NewReader("data"), 4)
	wantCancelled(t, "Put", err)
	rc, _, err := s.Get(ctx, "c/there")
	if err == nil {
		rc.Close()
	}
	wantCancelled(t, "Get", err)
	rc, err = s.GetRange(ctx, "c/there", 0, 1)
	if err == nil {
		rc.Close()
	}
	wantCancelled(t, "GetRange", err)
	_, err = s.Stat(ctx, "c/there")
	wantCancelled(t, "Stat", err)
	_, err = s.List(ctx, "")
	wantCancelled(t, "List", err)
	wantCancelled(t, "Delete", s.Delete(ctx, "c/there"))
	absent(t, s, "c/new")
	equal(t, s, "c/there", []byte("kept"))
}

// --- helpers ---

func put(t *testing.T, s blob.Store, key string, data []byte, size int64) blob.Info {
	t.Helper()
	info, err := s.Put(testenv.Ctx(t), key, bytes.NewReader(data), size)
	if err != nil {
		t.Fatalf("Put %s (%d bytes, size %d): %v", key, len(data), size, err)
	}
	return info
}

// equal checks that key holds data, through Get, Stat and a whole-object
// GetRange.
func equal(t *testing.T, s blob.Store, key string, data []byte) {
	t.Helper()
	ctx := testenv.Ctx(t)
	rc, info, err := s.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get %s: %v", key, err)
	}
	if got := readAll(t, rc); !bytes.Equal(got, data) {
		t.Errorf("Get %s = %d bytes %.20q, want %d bytes %.20q", key, len(got), got, len(data), data)
	}
	if info.Size != int64(len(data)) {
		t.Errorf("Get %s Info.Size = %d, want %d", key, info.Size, len(data))
	}
	st, err := s.Stat(ctx, key)
	if err != nil {
		t.Fatalf("Stat %s: %v", key, err)
	}
	if st.Size != int64(len(data)) {
		t.Errorf("Stat %s size = %d, want %d", key, st.Size, len(data))
	}
	rangeEqual(t, s, key, 0, -1, data)
}

func rangeEqual(t *testing.T, s blob.Store, key string, off, length int64, want []byte) {
	t.Helper()
	rc, err := s.GetRange(testenv.Ctx(t), key, off, length)
	if err != nil {
		t.Fatalf("GetRange %s %d+%d: %v", key, off, length, err)
	}
	if got := readAll(t, rc); !bytes.Equal(got, want) {
		t.Errorf("GetRange %s %d+%d = %d bytes, want %d bytes (equal prefix %d)", key, off, length, len(got), len(want), commonPrefix(got, want))
	}
}

// absent checks that no object is visible under key, to Stat, Get or List.
func absent(t *testing.T, s blob.Store, key string) {
	t.Helper()
	ctx := testenv.Ctx(t)
	_, err := s.Stat(ctx, key)
	wantClass(t, "Stat "+key, err, errdefs.ErrNotFound)
	rc, _, err := s.Get(ctx, key)
	if err == nil {
		rc.Close()
	}
	wantClass(t, "Get "+key, err, errdefs.ErrNotFound)
	for _, in := range mustList(t, s, "") {
		if in.Key == key {
			t.Errorf("List shows %s (%d bytes), want it absent", key, in.Size)
		}
	}
}

func mustList(t *testing.T, s blob.Store, prefix string) []blob.Info {
	t.Helper()
	list, err := s.List(testenv.Ctx(t), prefix)
	if err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	return list
}

func readAll(t *testing.T, rc io.ReadCloser) []byte {
	t.Helper()
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return b
}

func wantClass(t *testing.T, what string, err, class error) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Errorf("%s: error %v, want %v", what, err, class)
	}
}

func wantCancelled(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("%s with a cancelled context: error %v, want context.Canceled", what, err)
	}
}

// checkModTime allows for a store's clock and its second resolution.
func checkModTime(t *testing.T, what string, mt time.Time) {
	t.Helper()
	if d := time.Since(mt); d < -time.Minute || d > 10*time.Minute {
		t.Errorf("%s ModTime = %s, %s from now; want about now", what, mt, -d)
	}
}

// random returns n reproducible pseudo-random bytes: incompressible, and
// different for different seeds.
func random(seed uint64, n int) []byte {
	b := make([]byte, n)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(n), byte(n >> 8), byte(n >> 16)})
	r.Read(b)
	return b
}

// chunkReader returns at most max bytes per Read.
type chunkReader struct {
	r   io.Reader
	max int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(p) > c.max {
		p = p[:c.max]
	}
	return c.r.Read(p)
}

func indexOf(list []string, s string) int {
	for i, x := range list {
		if x == s {
			return i
		}
	}
	return -1
}

func commonPrefix(a, b []byte) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
