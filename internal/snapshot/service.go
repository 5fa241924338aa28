package snapshot

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/snapshot/archive"
	"github.com/torpor-dev/torpor/internal/snapshot/image"
)

// Service takes snapshots with an Engine and keeps them, signed and
// compressed, in a blob store. The image never touches a disk: the
// engine's files stream through archive → compress → hash → upload, and a
// restore downloads, verifies and unpacks into memory (a tmpfs) before the
// engine sees a byte.
type Service struct {
	engine Engine
	store  blob.Store
	keys   *image.Keyring
	cfg    ServiceConfig
	log    *slog.Logger
	compat image.Compat
	cache  *imageCache
}

// ServiceConfig tunes a Service.
type ServiceConfig struct {
	Compression image.Compression // default zstd
	Level       int               // codec level; 0 = the codec's fast default
	// ScratchDir holds the engine's sockets and logs and, on restore, the
	// unpacked image; default /dev/shm (memory) when it is a tmpfs.
	ScratchDir string
	// EngineVersion is recorded in manifests and checked on restore.
	EngineVersion string
	// CacheBytes bounds the verified, unpacked images kept in ScratchDir
	// for restoring again without download and unpacking; 0 means 256 MiB,
	// a negative value turns the cache off.
	CacheBytes int64
	// CacheName names this service's cache directory in ScratchDir; one
	// per worker on a host. A stable name (the app derives it from the
	// worker's home) lets a restarted worker clear its predecessor's;
	// default: a random one.
	CacheName string
}

// NewService wires a Service.
func NewService(engine Engine, store blob.Store, keys *image.Keyring, cfg ServiceConfig, log *slog.Logger) (*Service, error) {
	if cfg.ScratchDir == "" {
		cfg.ScratchDir = os.TempDir()
		var st unix.Statfs_t
		if unix.Statfs("/dev/shm", &st) == nil && st.Type == unix.TMPFS_MAGIC {
			cfg.ScratchDir = "/dev/shm"
		}
	}
	if cfg.EngineVersion == "" {
		return nil, fmt.Errorf("snapshot service: EngineVersion is empty")
	}
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return nil, fmt.Errorf("snapshot service: uname: %w", err)
	}
	s := &Service{engine: engine, store: store, keys: keys, cfg: cfg, log: log,
		compat: image.Compat{Arch: runtime.GOARCH, Kernel: unix.ByteSliceToString(uts.Release[:]), CRIUVersion: cfg.EngineVersion}}
	if cfg.CacheBytes == 0 {
		cfg.CacheBytes = 256 << 20
	}
	if cfg.CacheName == "" {
		cfg.CacheName = "torpor-images-" + randomHex()
	}
	budget := max(cfg.CacheBytes, 0) // off: every image is used once and removed
	var err error
	if s.cache, err = newImageCache(filepath.Join(cfg.ScratchDir, cfg.CacheName), budget); err != nil {
		return nil, fmt.Errorf("snapshot service: %w", err)
	}
	return s, nil
}

// Close removes the cached images.
func (s *Service) Close() error { return s.cache.close() }

// Store is the blob store the Service keeps images in.
func (s *Service) Store() blob.Store { return s.store }

// Engine is the Service's engine.
func (s *Service) Engine() Engine { return s.engine }

// Meta is what the caller knows about what it snapshots.
type Meta struct {
	Function    string
	Version     int
	Runtime     string // e.g. "python 3.11.7": restores need the same
	MemoryBytes int64
	Labels      map[string]string
}

// Result reports a stored snapshot.
type Result struct {
	ID         string
	Manifest   image.Manifest
	Checkpoint CheckpointStats // the engine's dump
	Image      image.Stats     // archive, compression, upload
	Wall       time.Duration
}

// Checkpoint dumps spec.Pid's tree and stores it; it returns the new
// snapshot's ID. On failure nothing is stored.
func (s *Service) Checkpoint(ctx context.Context, spec CheckpointSpec, meta Meta) (Result, error) {
	start := time.Now()
	if spec.WorkDir == "" {
		spec.WorkDir = s.cfg.ScratchDir
	}
	var cst CheckpointStats
	opts := image.WriteOptions{
		Compression: s.cfg.Compression,
		Level:       s.cfg.Level,
		Logger:      s.log,
		Manifest: image.Manifest{
			Function: meta.Function, FunctionVersion: meta.Version, Runtime: meta.Runtime,
			CRIUVersion: s.compat.CRIUVersion, Kernel: s.compat.Kernel, Arch: s.compat.Arch,
			MemoryBytes: meta.MemoryBytes, Labels: meta.Labels,
		},
	}
	id, m, ist, err := image.Write(ctx, s.store, s.keys, opts, func(ctx context.Context, w *archive.Writer) error {
		var err error
		cst, err = s.engine.Checkpoint(ctx, spec, archiveSink{w})
		return err
	})
	if err != nil {
		return Result{}, fmt.Errorf("snapshot of %s v%d (pid %d): %w", meta.Function, meta.Version, spec.Pid, err)
	}
	r := Result{ID: id, Manifest: m, Checkpoint: cst, Image: ist, Wall: time.Since(start)}
	s.log.Info("snapshot stored", "snapshot", short(id), "fn", meta.Function, "version", meta.Version,
		"raw_bytes", ist.RawBytes, "stored_bytes", ist.CompressedBytes, "dump", cst.Duration, "wall", r.Wall)
	return r, nil
}

// archiveSink hands the engine's files to the archive writer.
type archiveSink struct{ w *archive.Writer }

func (a archiveSink) Open(name string) (io.WriteCloser, error) { return a.w.Create(name, 0o600) }

// RestoreResult reports a restore.
type RestoreResult struct {
	Manifest image.Manifest
	Image    image.Stats // download, verification, decompression, unpacking
	Restore  RestoreStats
	Wall     time.Duration
	Cached   bool // the image came from this node's cache: no download, no unpacking
}

// Prefetch downloads, verifies and unpacks snapshot id into the image
// cache ahead of its first restore (workers do it when a snapshot becomes
// a start snapshot), so that no call waits for it. An image larger than the
// cache is not kept.
func (s *Service) Prefetch(ctx context.Context, id string, want Expect) error {
	full, err := image.Resolve(ctx, s.store, id)
	if err != nil {
		return fmt.Errorf("prefetch %s: %w", id, err)
	}
	ci, _, _, err := s.cache.get(ctx, full, s.reader(ctx, full, want))
	if err != nil {
		return fmt.Errorf("prefetch %s: %w", short(full), err)
	}
	s.cache.release(ci)
	return nil
}

// reader unpacks image full into a directory, verified for want.
func (s *Service) reader(ctx context.Context, full string, want Expect) func(dir string) (image.Manifest, image.Stats, error) {
	compat := s.compat
	compat.Runtime = want.Runtime
	return func(dir string) (image.Manifest, image.Stats, error) {
		// Ranged GETs in parallel: one stream from an object store runs
		// well below what the node can take; small images use one GET.
		m, ist, err := image.Read(ctx, s.store, s.keys, full, dir, compat, image.WithParallelDownload(4, 0))
		if err != nil {
			return m, ist, err
		}
		// The engine runs as root: nothing in dir may be a link or
		// special file, whatever the archive code promises.
		return m, ist, checkPlainFiles(dir)
	}
}

// Expect is what the caller restores a snapshot as: it must have been
// taken of this function version (Function "" accepts any) in this runtime.
type Expect struct {
	Function string
	Version  int
	Runtime  string
}

// Restore fetches snapshot id (an ID or a unique prefix), verifies it
// (digest, signature, compatibility with this node, want) and restores it
// as spec says. A snapshot that fails verification is never handed to the
// engine: the error then satisfies image.IsRefused.
func (s *Service) Restore(ctx context.Context, id string, want Expect, spec RestoreSpec) (RestoreResult, error) {
	start := time.Now()
	if spec.WorkDir == "" {
		spec.WorkDir = s.cfg.ScratchDir
	}
	full, err := image.Resolve(ctx, s.store, id)
	if err != nil {
		return RestoreResult{}, fmt.Errorf("restore %s: %w", id, err)
	}
	compat := s.compat
	compat.Runtime = want.Runtime
	ci, ist, cached, err := s.cache.get(ctx, full, s.reader(ctx, full, want))
	if err != nil {
		return RestoreResult{Image: ist}, fmt.Errorf("restore %s: %w", short(full), err)
	}
	defer s.cache.release(ci)
	m, dir := ci.manifest, ci.dir
	if want.Function != "" && (m.Function != want.Function || m.FunctionVersion != want.Version) {
		return RestoreResult{}, fmt.Errorf("restore %s: it is a snapshot of %s v%d, not of %s v%d: %w",
			short(full), m.Function, m.FunctionVersion, want.Function, want.Version, image.ErrIncompatible)
	}
	if cached {
		// Verified when it was unpacked, perhaps for another runtime.
		// (That it still exists, Resolve checked: a deleted snapshot is
		// not restored from the cache.)
		if err := compat.Check(full, m); err != nil {
			return RestoreResult{}, fmt.Errorf("restore %s: %w", short(full), err)
		}
	}
	spec.ImagesDir = dir
	spec.EmptyNetwork = m.Labels[LabelNoInetSockets] == "true"
	rst, err := s.engine.Restore(ctx, spec)
	if err != nil {
		return RestoreResult{Manifest: m, Image: ist}, fmt.Errorf("restore %s: %w", short(full), err)
	}
	r := RestoreResult{Manifest: m, Image: ist, Restore: rst, Wall: time.Since(start), Cached: cached}
	s.log.Info("snapshot restored", "snapshot", short(full), "fn", m.Function, "version", m.FunctionVersion,
		"pid", rst.Pid, "cached", cached, "download", ist.Transfer, "restore", rst.Duration, "wall", r.Wall)
	return r, nil
}

func checkPlainFiles(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type()&fs.ModeType != 0 {
			return fmt.Errorf("unpacked image holds %s, which is not a regular file", e.Name())
		}
	}
	return nil
}

// short abbreviates a snapshot ID for logs and messages.
func short(id string) string {
	id = strings.TrimPrefix(id, image.IDPrefix)
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
