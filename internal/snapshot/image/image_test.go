package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/snapshot/archive"
)

// testKey returns a Keyring made from seed.
func testKey(t testing.TB, seed byte) *Keyring {
	t.Helper()
	k, err := NewKeyring(bytes.Repeat([]byte{seed}, KeySize))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// node is the Compat of the test node; testManifest matches it.
var node = Compat{Arch: runtime.GOARCH, Kernel: "6.8.0-31-generic", Runtime: "python 3.11.7", CRIUVersion: "4.0"}

func testOptions(c Compression) WriteOptions {
	return WriteOptions{
		Compression: c,
		Manifest: Manifest{
			Function: "hello", FunctionVersion: 3, Runtime: node.Runtime,
			CRIUVersion: "3.19", Kernel: "6.1.0-18-amd64", MemoryBytes: 42 << 20,
			Labels: map[string]string{"tier": "test"},
		},
	}
}

// testFiles are image files: pages-1.img is large, the rest small.
func testFiles(zero bool, pagesSize int) map[string][]byte {
	rng := rand.New(rand.NewPCG(3, 4))
	pages := make([]byte, pagesSize)
	if !zero {
		for i := range pages {
			pages[i] = byte(rng.Uint32())
		}
	}
	return map[string][]byte{
		"pages-1.img":   pages,
		"pagemap-1.img": bytes.Repeat([]byte("pagemap!"), 5000),
		"core-1.img":    []byte("core"),
		"empty.img":     nil,
	}
}

// produceFiles writes files concurrently, each in chunks of odd sizes, as a
// CRIU --stream dump would.
func produceFiles(files map[string][]byte) func(context.Context, *archive.Writer) error {
	return func(ctx context.Context, w *archive.Writer) error {
		var wg sync.WaitGroup
		errs := make(chan error, len(files))
		for name, data := range files {
			f, err := w.Create(name, 0o600)
			if err != nil {
				return err
			}
			wg.Go(func() {
				for rest := data; len(rest) > 0; {
					n := min(len(rest), 65536+len(name))
					if _, err := f.Write(rest[:n]); err != nil {
						errs <- err
						return
					}
					rest = rest[n:]
				}
				errs <- f.Close()
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
}

// eventually polls cond until it holds or timeout passes.
func eventually(t testing.TB, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: "+format, append([]any{timeout}, args...)...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// noLeak fails the test if it leaves goroutines behind (codec workers,
// pipeline stages, uploads).
func noLeak(t testing.TB) {
	t.Helper()
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		eventually(t, 5*time.Second, func() bool { return runtime.NumGoroutine() <= before },
			"%d goroutines left running, %d before the test", runtime.NumGoroutine(), before)
	})
}

func newDir(t testing.TB) string {
	t.Helper()
	d := filepath.Join(t.TempDir(), "restore")
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

func dirEntries(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestRoundTrip(t *testing.T) {
	for _, c := range []Compression{Zstd, LZ4, None} {
		for _, zero := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/zero=%v", c, zero), func(t *testing.T) {
				noLeak(t)
				ctx := context.Background()
				store, key := newMemStore(), testKey(t, 1)
				files := testFiles(zero, 5<<20+123)
				id, m, st, err := Write(ctx, store, key, testOptions(c), produceFiles(files))
				if err != nil {
					t.Fatal(err)
				}
				// The ID is the digest of the stored manifest bytes.
				hexID := strings.TrimPrefix(id, IDPrefix)
				stored := store.get(t, ManifestPrefix+hexID)
				if sum := sha256.Sum256(stored); fmt.Sprintf("%x", sum) != hexID {
					t.Fatalf("id %s is not the sha256 of the stored manifest", id)
				}
				if keys := store.keys(); len(keys) != 2 || keys[0] != m.DataKey || keys[1] != ManifestPrefix+hexID {
					t.Fatalf("store holds %v", keys)
				}
				data := store.get(t, m.DataKey)
				if int64(len(data)) != m.DataSize || fmt.Sprintf("%x", sha256.Sum256(data)) != m.DataSHA256 {
					t.Fatal("manifest does not describe the data object")
				}
				if st.CompressedBytes != m.DataSize || st.RawBytes != m.RawSize || st.Wall <= 0 {
					t.Fatalf("stats %+v do not match manifest", st)
				}
				if zero && c != None && m.DataSize > m.RawSize/20 {
					t.Errorf("zero data compressed to %d of %d bytes", m.DataSize, m.RawSize)
				}
				if m.Compression != c || m.Function != "hello" || m.FunctionVersion != 3 || m.Arch != runtime.GOARCH ||
					m.KeyID != key.ID() || m.MemoryBytes != 42<<20 || m.Labels["tier"] != "test" || len(m.Files) != len(files) || m.CreatedAt.IsZero() {
					t.Fatalf("manifest %+v", m)
				}
				for i, f := range m.Files {
					if int64(len(files[f.Name])) != f.Size || i > 0 && m.Files[i-1].Name >= f.Name {
						t.Errorf("manifest file %d %+v wrong or unsorted", i, f)
					}
				}
				statM, err := Stat(ctx, store, id)
				if err != nil || statM.Signature != m.Signature {
					t.Fatalf("Stat = %+v, %v", statM, err)
				}

				dir := newDir(t)
				got, rst, err := Read(ctx, store, key, id, dir, node)
				if err != nil {
					t.Fatal(err)
				}
				if got.Signature != m.Signature || rst.RawBytes != m.RawSize || rst.CompressedBytes != m.DataSize {
					t.Fatalf("Read returned %+v, stats %+v", got, rst)
				}
				if names := dirEntries(t, dir); len(names) != len(files) {
					t.Fatalf("restored %v", names)
				}
				for name, want := range files {
					b, err := os.ReadFile(filepath.Join(dir, name))
					if err != nil || !bytes.Equal(b, want) {
						t.Errorf("%s: %d bytes, %v; want %d bytes", name, len(b), err, len(want))
					}
				}
				// A prefix of the ID resolves to it.
				if r, err := Resolve(ctx, store, hexID[:8]); err != nil || r != id {
					t.Errorf("Resolve(%s) = %s, %v", hexID[:8], r, err)
				}
			})
		}
	}
}

// written is one image written for a tamper test.
type written struct {
	store *memStore
	key   *Keyring
	id    string
	m     Manifest
	files map[string][]byte
}

func writeImage(t testing.TB, c Compression) written {
	t.Helper()
	store, key := newMemStore(), testKey(t, 1)
	files := testFiles(false, 3<<20)
	id, m, _, err := Write(context.Background(), store, key, testOptions(c), produceFiles(files))
	if err != nil {
		t.Fatal(err)
	}
	return written{store: store, key: key, id: id, m: m, files: files}
}

// storeManifest stores m, signed with key if key is not nil, as is
// otherwise, and returns its ID.
func storeManifest(t testing.TB, s *memStore, key *Keyring, m Manifest) string {
	t.Helper()
	var b []byte
	var err error
	if key != nil {
		b, _, err = key.SignManifest(&m)
	} else {
		b, err = m.encode()
	}
	if err != nil {
		t.Fatal(err)
	}
	id := idOf(b)
	s.set(ManifestPrefix+strings.TrimPrefix(id, IDPrefix), b)
	return id
}

func flip(b []byte, i int) []byte { b[i] ^= 0x40; return b }

func TestReadRefuses(t *testing.T) {
	type tc struct {
		name   string
		c      Compression // default zstd
		tamper func(t *testing.T, w *written) (id string, compat Compat)
		class  error
		want   string
	}
	same := func(w *written) (string, Compat) { return w.id, node }
	tests := []tc{
		{name: "data byte flipped in the middle", tamper: func(t *testing.T, w *written) (string, Compat) {
			d := w.store.get(t, w.m.DataKey)
			w.store.set(w.m.DataKey, flip(d, len(d)/2))
			return same(w)
		}, class: ErrCorrupt},
		{name: "data byte flipped at the end", tamper: func(t *testing.T, w *written) (string, Compat) {
			d := w.store.get(t, w.m.DataKey)
			w.store.set(w.m.DataKey, flip(d, len(d)-1))
			return same(w)
		}, class: ErrCorrupt},
		{name: "lz4 data byte flipped", c: LZ4, tamper: func(t *testing.T, w *written) (string, Compat) {
			d := w.store.get(t, w.m.DataKey)
			w.store.set(w.m.DataKey, flip(d, len(d)/3))
			return same(w)
		}, class: ErrCorrupt},
		{name: "uncompressed data byte flipped", c: None, tamper: func(t *testing.T, w *written) (string, Compat) {
			d := w.store.get(t, w.m.DataKey)
			w.store.set(w.m.DataKey, flip(d, len(d)/2))
			return same(w)
		}, class: ErrCorrupt},
		{name: "self-consistent archive swapped in", c: None, tamper: func(t *testing.T, w *written) (string, Compat) {
			// An attacker with store access writes a valid archive of the
			// same size: only the signed digest can tell.
			var buf bytes.Buffer
			evil := map[string][]byte{}
			for name, data := range w.files {
				evil[name] = bytes.Repeat([]byte{'X'}, len(data))
			}
			aw := archive.NewWriter(&buf)
			if err := produceFiles(evil)(context.Background(), aw); err != nil {
				t.Fatal(err)
			}
			aw.Close()
			if int64(buf.Len()) != w.m.DataSize {
				t.Fatalf("evil archive is %d bytes, want %d", buf.Len(), w.m.DataSize)
			}
			w.store.set(w.m.DataKey, buf.Bytes())
			return same(w)
		}, class: ErrCorrupt, want: "data does not match the manifest"},
		{name: "data truncated", tamper: func(t *testing.T, w *written) (string, Compat) {
			d := w.store.get(t, w.m.DataKey)
			w.store.set(w.m.DataKey, d[:len(d)-100])
			return same(w)
		}, class: ErrTruncated, want: fmt.Sprintf("is truncated: got %d of %d bytes", 0, 0)},
		{name: "data truncated, size unknown", tamper: func(t *testing.T, w *written) (string, Compat) {
			d := w.store.get(t, w.m.DataKey)
			w.store.set(w.m.DataKey, d[:len(d)/2])
			w.store.hideSize = true
			return same(w)
		}, class: ErrTruncated, want: "is truncated: got"},
		{name: "uncompressed data truncated, size unknown", c: None, tamper: func(t *testing.T, w *written) (string, Compat) {
			d := w.store.get(t, w.m.DataKey)
			w.store.set(w.m.DataKey, d[:len(d)/2])
			w.store.hideSize = true
			return same(w)
		}, class: ErrTruncated, want: "is truncated: got"},
		{name: "data extended", tamper: func(t *testing.T, w *written) (string, Compat) {
			w.store.set(w.m.DataKey, append(w.store.get(t, w.m.DataKey), 0))
			return same(w)
		}, class: ErrCorrupt, want: "the manifest says"},
		{name: "data extended, size unknown", tamper: func(t *testing.T, w *written) (string, Compat) {
			w.store.set(w.m.DataKey, append(w.store.get(t, w.m.DataKey), 0))
			w.store.hideSize = true
			return same(w)
		}, class: ErrCorrupt},
		{name: "data missing", tamper: func(t *testing.T, w *written) (string, Compat) {
			w.store.Delete(context.Background(), w.m.DataKey)
			return same(w)
		}, class: ErrCorrupt, want: "is missing"},
		{name: "manifest byte flipped", tamper: func(t *testing.T, w *written) (string, Compat) {
			k := ManifestPrefix + strings.TrimPrefix(w.id, IDPrefix)
			w.store.set(k, flip(w.store.get(t, k), 30))
			return same(w)
		}, class: ErrCorrupt, want: "manifest digest mismatch"},
		{name: "manifest re-signed with another key", tamper: func(t *testing.T, w *written) (string, Compat) {
			m := w.m
			m.Runtime = "python 3.12.0"
			return storeManifest(t, w.store, testKey(t, 2), m), node
		}, class: ErrBadSignature, want: fmt.Sprintf("signed with key %s, this node has key %s", testKey(t, 2).ID(), testKey(t, 1).ID())},
		{name: "manifest edited, signature kept", tamper: func(t *testing.T, w *written) (string, Compat) {
			m := w.m
			m.MemoryBytes++
			return storeManifest(t, w.store, nil, m), node
		}, class: ErrBadSignature, want: "does not match the manifest"},
		{name: "manifest signature removed", tamper: func(t *testing.T, w *written) (string, Compat) {
			m := w.m
			m.Signature = ""
			return storeManifest(t, w.store, nil, m), node
		}, class: ErrBadSignature, want: "missing or malformed"},
		{name: "manifest with unknown field", tamper: func(t *testing.T, w *written) (string, Compat) {
			b, _ := w.m.encode()
			b = append([]byte(`{"evil":1,`), b[1:]...)
			id := idOf(b)
			w.store.set(ManifestPrefix+strings.TrimPrefix(id, IDPrefix), b)
			return id, node
		}, class: ErrCorrupt, want: "does not decode"},
		{name: "future format", tamper: func(t *testing.T, w *written) (string, Compat) {
			m := w.m
			m.Format = 2
			return storeManifest(t, w.store, w.key, m), node
		}, class: ErrIncompatible, want: "format 2"},
		{name: "other arch", tamper: func(t *testing.T, w *written) (string, Compat) {
			c := node
			c.Arch = "riscv64"
			return w.id, c
		}, class: ErrIncompatible, want: "arch"},
		{name: "other runtime", tamper: func(t *testing.T, w *written) (string, Compat) {
			c := node
			c.Runtime = "python 3.11.8"
			return w.id, c
		}, class: ErrIncompatible, want: "runtime"},
		{name: "older kernel", tamper: func(t *testing.T, w *written) (string, Compat) {
			c := node
			c.Kernel = "5.15.0"
			return w.id, c
		}, class: ErrIncompatible, want: "kernel 6.1.0-18-amd64, this node has the older 5.15.0 (restore needs 6.1 or newer)"},
		{name: "older criu", tamper: func(t *testing.T, w *written) (string, Compat) {
			c := node
			c.CRIUVersion = "3.18"
			return w.id, c
		}, class: ErrIncompatible, want: "CRIU"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := tt.c
			if c == "" {
				c = Zstd
			}
			noLeak(t)
			w := writeImage(t, c)
			id, compat := tt.tamper(t, &w)
			want := tt.want
			if tt.class == ErrTruncated && strings.Contains(want, "got 0 of 0") {
				want = fmt.Sprintf("got %d of %d bytes", w.m.DataSize-100, w.m.DataSize)
			}
			dir := newDir(t)
			_, _, err := Read(context.Background(), w.store, w.key, id, dir, compat)
			t.Log(err)
			if !errors.Is(err, tt.class) || !strings.Contains(err.Error(), want) {
				t.Fatalf("Read: %v\nwant %v containing %q", err, tt.class, want)
			}
			if !errors.Is(err, errdefs.ErrInvalid) || !IsRefused(err) {
				t.Errorf("%v should match errdefs.ErrInvalid and IsRefused", err)
			}
			if names := dirEntries(t, dir); len(names) != 0 {
				t.Errorf("dir holds %v after a refused Read", names)
			}
		})
	}
}

func TestReadNewerNodeAccepts(t *testing.T) {
	w := writeImage(t, LZ4)
	c := Compat{Arch: runtime.GOARCH, Kernel: "7.0.1", Runtime: node.Runtime, CRIUVersion: "3.19.1"}
	if _, _, err := Read(context.Background(), w.store, w.key, w.id, newDir(t), c); err != nil {
		t.Fatal(err)
	}
}

func TestReadArguments(t *testing.T) {
	w := writeImage(t, Zstd)
	ctx := context.Background()
	t.Run("bad id", func(t *testing.T) {
		if _, _, err := Read(ctx, w.store, w.key, "sha256:xyz", newDir(t), node); !errors.Is(err, errdefs.ErrInvalid) || IsRefused(err) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("unknown id", func(t *testing.T) {
		id := IDPrefix + strings.Repeat("0", 64)
		if _, _, err := Read(ctx, w.store, w.key, id, newDir(t), node); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("dir not empty", func(t *testing.T) {
		dir := newDir(t)
		os.WriteFile(filepath.Join(dir, "x"), nil, 0o600)
		if _, _, err := Read(ctx, w.store, w.key, w.id, dir, node); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("id without prefix", func(t *testing.T) {
		if _, _, err := Read(ctx, w.store, w.key, strings.TrimPrefix(w.id, IDPrefix), newDir(t), node); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		noLeak(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		dir := newDir(t)
		if _, _, err := Read(cctx, w.store, w.key, w.id, dir, node); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v", err)
		}
		if names := dirEntries(t, dir); len(names) != 0 {
			t.Errorf("dir holds %v", names)
		}
	})
}

// errProduce is what failing produce functions return.
var errProduce = errors.New("criu dump failed")

func TestWriteFailures(t *testing.T) {
	tests := []struct {
		name    string
		produce func(cancel context.CancelFunc) func(context.Context, *archive.Writer) error
		failPut func(key string) error
		want    error
	}{
		{"produce fails", func(context.CancelFunc) func(context.Context, *archive.Writer) error {
			return func(ctx context.Context, w *archive.Writer) error {
				f, _ := w.Create("pages-1.img", 0o600)
				f.Write(make([]byte, 3<<20))
				return errProduce
			}
		}, nil, errProduce},
		{"file left open", func(context.CancelFunc) func(context.Context, *archive.Writer) error {
			return func(ctx context.Context, w *archive.Writer) error {
				f, _ := w.Create("pages-1.img", 0o600)
				f.Write([]byte("x"))
				return nil
			}
		}, nil, errdefs.ErrInvalid},
		{"cancelled mid-write", func(cancel context.CancelFunc) func(context.Context, *archive.Writer) error {
			return func(ctx context.Context, w *archive.Writer) error {
				f, _ := w.Create("pages-1.img", 0o600)
				chunk := make([]byte, 1<<20)
				for i := 0; ; i++ {
					if i == 3 {
						cancel()
					}
					if _, err := f.Write(chunk); err != nil {
						return err
					}
				}
			}
		}, nil, context.Canceled},
		{"data upload fails", func(context.CancelFunc) func(context.Context, *archive.Writer) error {
			return produceFiles(testFiles(false, 1<<20))
		}, func(key string) error {
			if strings.HasPrefix(key, DataPrefix) {
				return fmt.Errorf("bucket gone: %w", errdefs.ErrUnavailable)
			}
			return nil
		}, errdefs.ErrUnavailable},
		{"manifest upload fails", func(context.CancelFunc) func(context.Context, *archive.Writer) error {
			return produceFiles(testFiles(false, 1<<20))
		}, func(key string) error {
			if strings.HasPrefix(key, ManifestPrefix) {
				return fmt.Errorf("bucket gone: %w", errdefs.ErrUnavailable)
			}
			return nil
		}, errdefs.ErrUnavailable},
	}
	for _, tt := range tests {
		for _, c := range []Compression{Zstd, LZ4, None} {
			t.Run(tt.name+"/"+string(c), func(t *testing.T) {
				noLeak(t)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				store := newMemStore()
				store.failPut = tt.failPut
				id, _, _, err := Write(ctx, store, testKey(t, 1), testOptions(c), tt.produce(cancel))
				if !errors.Is(err, tt.want) || id != "" {
					t.Fatalf("Write = %q, %v; want %v", id, err, tt.want)
				}
				if keys := store.keys(); len(keys) != 0 {
					t.Errorf("store holds %v after a failed Write", keys)
				}
			})
		}
	}
}

func TestWriteOptionsRejected(t *testing.T) {
	ok := testOptions(Zstd)
	tests := []struct {
		name string
		edit func(o *WriteOptions)
		want string
	}{
		{"no runtime", func(o *WriteOptions) { o.Manifest.Runtime = "" }, "Manifest.Runtime is empty"},
		{"no criu", func(o *WriteOptions) { o.Manifest.CRIUVersion = " " }, "Manifest.CRIUVersion is empty"},
		{"no kernel", func(o *WriteOptions) { o.Manifest.Kernel = "" }, "Manifest.Kernel is empty"},
		{"unknown codec", func(o *WriteOptions) { o.Compression = "brotli" }, `"brotli" is not supported`},
		{"zstd level", func(o *WriteOptions) { o.Level = 23 }, "level 23 is not valid for zstd"},
		{"lz4 level", func(o *WriteOptions) { o.Compression, o.Level = LZ4, 1 }, "level 1 is not valid for lz4"},
		{"none level", func(o *WriteOptions) { o.Compression, o.Level = None, 1 }, "level 1 is not valid for none"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := ok
			tt.edit(&o)
			store := newMemStore()
			_, _, _, err := Write(context.Background(), store, testKey(t, 1), o, produceFiles(nil))
			if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrInvalid containing %q", err, tt.want)
			}
			if len(store.keys()) != 0 {
				t.Error("store written")
			}
		})
	}
	if _, _, _, err := Write(context.Background(), newMemStore(), nil, ok, produceFiles(nil)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("nil key: %v", err)
	}
}

func TestWriteLevels(t *testing.T) {
	for _, tc := range []struct {
		c     Compression
		level int
	}{{Zstd, 1}, {Zstd, 3}, {Zstd, 9}, {Zstd, 19}, {LZ4, 0}} {
		t.Run(fmt.Sprintf("%s-%d", tc.c, tc.level), func(t *testing.T) {
			store, key := newMemStore(), testKey(t, 1)
			o := testOptions(tc.c)
			o.Level = tc.level
			files := testFiles(true, 1<<20)
			id, _, _, err := Write(context.Background(), store, key, o, produceFiles(files))
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := Read(context.Background(), store, key, id, newDir(t), node); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestCompatCheck(t *testing.T) {
	m := Manifest{Arch: "amd64", Runtime: "node 20.11.0", Kernel: "6.1.0-18-amd64", CRIUVersion: "3.19"}
	tests := []struct {
		name string
		c    Compat
		want string // "" = compatible
	}{
		{"same", Compat{"amd64", "6.1.0-18-amd64", "node 20.11.0", "3.19"}, ""},
		{"newer patch", Compat{"amd64", "6.1.99", "node 20.11.0", "3.19.2"}, ""},
		{"newer minor", Compat{"amd64", "6.10.1", "node 20.11.0", "3.20"}, ""},
		{"newer major", Compat{"amd64", "7.0", "node 20.11.0", "4.0"}, ""},
		{"arch", Compat{"arm64", "6.1", "node 20.11.0", "3.19"}, "arch"},
		{"runtime", Compat{"amd64", "6.1", "node 20.11.1", "3.19"}, "runtime"},
		{"older kernel minor", Compat{"amd64", "6.0.9", "node 20.11.0", "3.19"}, "kernel"},
		{"older kernel major", Compat{"amd64", "5.19", "node 20.11.0", "3.19"}, "kernel"},
		{"older criu", Compat{"amd64", "6.1", "node 20.11.0", "3.9"}, "CRIU"},
		{"unparsable node kernel", Compat{"amd64", "", "node 20.11.0", "3.19"}, "this node's kernel"},
		{"unparsable node criu", Compat{"amd64", "6.1", "node 20.11.0", "4"}, "this node's CRIU"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.c.Check("sha256:x", m)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrIncompatible) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want ErrIncompatible naming %q", err, tt.want)
			}
		})
	}
}

func TestMajorMinor(t *testing.T) {
	tests := []struct {
		in       string
		maj, min int
		ok       bool
	}{
		{"6.8.0-31-generic", 6, 8, true},
		{"6.18.44-fc-v669", 6, 18, true},
		{"Version: 4.0", 4, 0, true},
		{"3.19", 3, 19, true},
		{"4", 0, 0, false},
		{"", 0, 0, false},
		{"v.1", 0, 0, false},
		{"99999999999999999999.1", 0, 0, false},
	}
	for _, tt := range tests {
		maj, min, ok := majorMinor(tt.in)
		if maj != tt.maj || min != tt.min || ok != tt.ok {
			t.Errorf("majorMinor(%q) = %d, %d, %v; want %d, %d, %v", tt.in, maj, min, ok, tt.maj, tt.min, tt.ok)
		}
	}
}

func TestErrorClasses(t *testing.T) {
	for _, s := range []error{ErrCorrupt, ErrTruncated, ErrBadSignature, ErrIncompatible} {
		if !errors.Is(s, errdefs.ErrInvalid) || !IsRefused(s) || !IsRefused(fmt.Errorf("x: %w", s)) {
			t.Errorf("%v: should match errdefs.ErrInvalid and IsRefused", s)
		}
	}
	if IsRefused(errdefs.ErrInvalid) || IsRefused(io.EOF) || IsRefused(nil) {
		t.Error("IsRefused of a non-image error")
	}
	e := refuse(ErrCorrupt, io.ErrUnexpectedEOF, "snapshot x: bad")
	if !errors.Is(e, ErrCorrupt) || !errors.Is(e, errdefs.ErrInvalid) || !errors.Is(e, io.ErrUnexpectedEOF) || errors.Is(e, ErrTruncated) {
		t.Errorf("classed error matches wrongly: %v", e)
	}
	if e.Error() != "snapshot x: bad: unexpected EOF" {
		t.Errorf("message %q", e.Error())
	}
}

func TestParallelDownload(t *testing.T) {
	const chunk = 64 << 10
	errNet := fmt.Errorf("connection reset: %w", errdefs.ErrUnavailable)
	tests := []struct {
		name   string
		c      Compression
		tamper func(t *testing.T, w *written)
		check  func(err error) bool
	}{
		{"intact zstd", Zstd, func(*testing.T, *written) {}, func(err error) bool { return err == nil }},
		{"intact none", None, func(*testing.T, *written) {}, func(err error) bool { return err == nil }},
		{"flipped", Zstd, func(t *testing.T, w *written) {
			d := w.store.get(t, w.m.DataKey)
			w.store.set(w.m.DataKey, flip(d, len(d)/2))
		}, func(err error) bool { return errors.Is(err, ErrCorrupt) }},
		{"truncated, size known", LZ4, func(t *testing.T, w *written) {
			d := w.store.get(t, w.m.DataKey)
			w.store.set(w.m.DataKey, d[:len(d)-1])
		}, func(err error) bool { return errors.Is(err, ErrTruncated) }},
		{"truncated mid-chunk, size unknown", Zstd, func(t *testing.T, w *written) {
			d := w.store.get(t, w.m.DataKey)
			w.store.set(w.m.DataKey, d[:5*chunk+100])
			w.store.hideSize = true
		}, func(err error) bool {
			return errors.Is(err, ErrTruncated) && strings.Contains(err.Error(), fmt.Sprintf("got %d of", 5*chunk+100))
		}},
		{"truncated at a chunk boundary, size unknown", None, func(t *testing.T, w *written) {
			d := w.store.get(t, w.m.DataKey)
			w.store.set(w.m.DataKey, d[:7*chunk])
			w.store.hideSize = true
		}, func(err error) bool { return errors.Is(err, ErrTruncated) }},
		{"network error", Zstd, func(t *testing.T, w *written) {
			w.store.failRange = func(off int64) error {
				if off == 9*chunk {
					return errNet
				}
				return nil
			}
		}, func(err error) bool { return errors.Is(err, errdefs.ErrUnavailable) && !IsRefused(err) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			noLeak(t)
			w := writeImage(t, tt.c)
			tt.tamper(t, &w)
			dir := newDir(t)
			_, _, err := Read(context.Background(), w.store, w.key, w.id, dir, node, WithParallelDownload(3, chunk))
			t.Log(err)
			if !tt.check(err) {
				t.Fatalf("Read: %v", err)
			}
			if err != nil {
				if names := dirEntries(t, dir); len(names) != 0 {
					t.Errorf("dir holds %v after a failed Read", names)
				}
				return
			}
			for name, want := range w.files {
				if b, err := os.ReadFile(filepath.Join(dir, name)); err != nil || !bytes.Equal(b, want) {
					t.Errorf("%s differs: %v", name, err)
				}
			}
		})
	}
}

func TestReadLocalErrorIsNotRefusal(t *testing.T) {
	w := writeImage(t, Zstd)
	_, _, err := Read(context.Background(), w.store, w.key, w.id, filepath.Join(t.TempDir(), "missing"), node)
	if err == nil || IsRefused(err) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Read into a missing dir: %v; want a not-exist error that is no refusal", err)
	}
}
