package image

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/internal/snapshot/archive"
)

// Run with: go test -run '^$' -bench . -benchtime 5x ./internal/snapshot/image/
// Each benchmark reports, besides the end-to-end MB/s of raw (archive)
// bytes, the busy-time throughput of each stage (see Stats) and the
// compression ratio. "none" is the baseline the codecs compare against.

const benchSize = 64 << 20

var benchCodecs = []Compression{Zstd, LZ4, None}

func benchData(kind string) []byte {
	p := make([]byte, benchSize)
	if kind == "random" {
		rng := rand.New(rand.NewPCG(5, 6))
		for i := 0; i+8 <= len(p); i += 8 {
			v := rng.Uint64()
			for j := range 8 {
				p[i+j] = byte(v >> (8 * j))
			}
		}
	}
	return p
}

// produceBench writes data as one pages file in 1 MiB writes plus a small
// core file, roughly what a dump of one process looks like.
func produceBench(data []byte) func(context.Context, *archive.Writer) error {
	return func(ctx context.Context, w *archive.Writer) error {
		files := map[string][]byte{"pages-1.img": data, "core-1.img": data[:4096]}
		return produceFiles(files)(ctx, w)
	}
}

// stageTotals sums Stats over iterations.
type stageTotals struct {
	n                      int
	raw, compressed        int64
	wall, arch, comp, xfer time.Duration
}

func (s *stageTotals) add(st Stats) {
	s.n++
	s.raw += st.RawBytes
	s.compressed += st.CompressedBytes
	s.wall += st.Wall
	s.arch += st.Archive
	s.comp += st.Compress
	s.xfer += st.Transfer
}

func (s *stageTotals) report(b *testing.B, archName, compName, xferName string) {
	if s.n == 0 {
		return
	}
	b.ReportMetric(MBps(s.raw, s.arch), archName+"-MB/s")
	b.ReportMetric(MBps(s.raw, s.comp), compName+"-MB/s")
	b.ReportMetric(MBps(s.compressed, s.xfer), xferName+"-MB/s")
	b.ReportMetric(float64(s.raw)/float64(max(s.compressed, 1)), "ratio")
}

func BenchmarkWrite(b *testing.B) {
	ctx := context.Background()
	key := testKey(b, 1)
	for _, kind := range []string{"random", "zero"} {
		data := benchData(kind)
		for _, c := range benchCodecs {
			b.Run(string(c)+"/"+kind, func(b *testing.B) {
				b.SetBytes(benchSize)
				var tot stageTotals
				for b.Loop() {
					store := newMemStore()
					_, _, st, err := Write(ctx, store, key, testOptions(c), produceBench(data))
					if err != nil {
						b.Fatal(err)
					}
					tot.add(st)
				}
				tot.report(b, "produce", "compress", "upload")
			})
		}
	}
}

func BenchmarkRead(b *testing.B) {
	ctx := context.Background()
	key := testKey(b, 1)
	parent := b.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		// Restores go to a tmpfs; measure that, not the disk.
		if d, err := os.MkdirTemp("/dev/shm", "torpor-bench-"); err == nil {
			parent = d
			b.Cleanup(func() { os.RemoveAll(d) })
		}
	}
	for _, kind := range []string{"random", "zero"} {
		data := benchData(kind)
		for _, c := range benchCodecs {
			b.Run(string(c)+"/"+kind, func(b *testing.B) {
				store := newMemStore()
				id, _, _, err := Write(ctx, store, key, testOptions(c), produceBench(data))
				if err != nil {
					b.Fatal(err)
				}
				dir := filepath.Join(parent, "restore")
				b.SetBytes(benchSize)
				var tot stageTotals
				for b.Loop() {
					b.StopTimer()
					os.RemoveAll(dir)
					if err := os.Mkdir(dir, 0o700); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
					_, st, err := Read(ctx, store, key, id, dir, node)
					if err != nil {
						b.Fatal(err)
					}
					tot.add(st)
				}
				tot.report(b, "extract", "decompress", "download")
			})
		}
	}
}

// BenchmarkCodec measures the codecs alone, in memory, with the options
// Write and Read use: the ceiling of the compress and decompress stages.
func BenchmarkCodec(b *testing.B) {
	for _, kind := range []string{"random", "zero"} {
		data := benchData(kind)
		for _, c := range []Compression{Zstd, LZ4} {
			var compressed bytes.Buffer
			b.Run(string(c)+"/"+kind+"/compress", func(b *testing.B) {
				b.SetBytes(benchSize)
				for b.Loop() {
					compressed.Reset()
					w, err := newCompressor(&compressed, c, 0, 0)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := w.Write(data); err != nil {
						b.Fatal(err)
					}
					if err := w.Close(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(benchSize)/float64(compressed.Len()), "ratio")
			})
			b.Run(string(c)+"/"+kind+"/decompress", func(b *testing.B) {
				b.SetBytes(benchSize)
				for b.Loop() {
					r, err := newDecompressor(bytes.NewReader(compressed.Bytes()), c, 0)
					if err != nil {
						b.Fatal(err)
					}
					if n, err := io.Copy(io.Discard, r); err != nil || n != benchSize {
						b.Fatalf("decompressed %d bytes: %v", n, err)
					}
					r.Close()
				}
			})
		}
	}
}
