package bench

// The snapshot benchmark (`torpor bench snapshot`) is the one benchmark of
// this package that does not drive a running torpor over HTTP: a snapshot
// is taken of a sandboxed process of this very process (sandboxes re-exec
// the binary as their init), so it runs the sandbox manager and the
// snapshot service in-process, exactly as a worker wires them, and
// measures them against an unpipelined baseline (criu dump to a directory,
// tar | zstd, upload; download, unzstd | untar, criu restore) run in the
// same process, on the same stores, in the same run.

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/internal/blob"
	"github.com/torpor-dev/torpor/internal/config"
	"github.com/torpor-dev/torpor/internal/errdefs"
	"github.com/torpor-dev/torpor/internal/sandbox"
	"github.com/torpor-dev/torpor/internal/snapshot"
	"github.com/torpor-dev/torpor/internal/snapshot/criu"
	"github.com/torpor-dev/torpor/internal/snapshot/image"
)

// Data kinds, stores and paths of the snapshot benchmark, as they appear in
// tables and files.
const (
	DataZero   = "zero"   // touched pages of a bytearray: one non-zero byte per 4 KiB page
	DataRandom = "random" // os.urandom: incompressible
	StoreLocal = "local"  // blob/localdir on a disk directory
	StoreMinIO = "minio"  // blob/s3store against a MinIO on loopback
	PathPipe   = "pipelined"
	PathBase   = "baseline"
)

// Defaults and bounds of SnapshotOptions.
const (
	DefaultSnapshotReps    = 3
	DefaultSnapshotNOPReps = 30
	MaxSnapshotSizeMB      = 2048
	// snapshotHeadroomMB is added to an instance's data for its memory
	// limit: the interpreter, and CRIU's restorer, which runs in the
	// instance's cgroup.
	snapshotHeadroomMB = 128
	// runTimeout bounds one checkpoint-and-restore of one instance.
	runTimeout = 10 * time.Minute
	// Targets of the snapshot engine (docs/benchmarks-snapshot.md).
	TargetSizeMB       = 100
	TargetCheckpoint   = time.Second
	TargetRestore      = 500 * time.Millisecond
	TargetNOPRestore   = 50 * time.Millisecond
	benchUIDBase       = 64100
	workloadReadyFile  = "/tmp/ready"
	workloadPollPeriod = time.Millisecond
)

// DefaultSnapshotSizes are the instance data sizes, in MB, measured by
// default.
var DefaultSnapshotSizes = []int{1, 16, 64, 256, 1024}

// workloadScript is the benchmarked instance: it allocates argv[1] MiB of
// argv[2] data, writes its size to /tmp/ready once every page is resident,
// and sleeps. Zero data is a bytearray with one byte set per page, so that
// every page is faulted in (the kernel's shared zero page would not be
// dumped) while the image stays as compressible as zeroed memory.
const workloadScript = `import os, sys, time
n = int(sys.argv[1]) << 20
if sys.argv[2] == "random":
    buf = os.urandom(n)
else:
    buf = bytearray(n)
    if n:
        buf[::4096] = b"\x01" * ((n + 4095) // 4096)
with open("/tmp/ready.tmp", "w") as f:
    f.write(str(n))
os.rename("/tmp/ready.tmp", "/tmp/ready")
while True:
    time.sleep(3600)
`

// SnapshotOptions configures Snapshot. The zero value of a field means its
// default.
type SnapshotOptions struct {
	SizesMB []int    // instance data sizes
	Kinds   []string // DataZero, DataRandom
	Stores  []string // StoreLocal, StoreMinIO
	Reps    int      // repetitions per size, kind and store
	NOPReps int      // restores of the NOP instance; negative: none
	// OutDir receives results.json, results.csv and the plots; empty
	// writes nothing.
	OutDir string
	// Python is the instances' interpreter (resolved behind any shim).
	Python string
	// MinIO is the MinIO server binary; empty looks in the usual places.
	MinIO string
	// WorkDir is where the local store, MinIO's data and the baseline's
	// files go; it should be on a disk. Default /var/tmp.
	WorkDir string
	// Log receives the services' logs; nil discards them.
	Log *slog.Logger
	Now func() time.Time
}

func (o *SnapshotOptions) normalize() error {
	bad := func(format string, a ...any) error {
		return errdefs.Invalid("bench snapshot: " + fmt.Sprintf(format, a...))
	}
	if len(o.SizesMB) == 0 {
		o.SizesMB = DefaultSnapshotSizes
	}
	for _, s := range o.SizesMB {
		if s < 1 || s > MaxSnapshotSizeMB {
			return bad("size %d MB: use 1-%d", s, MaxSnapshotSizeMB)
		}
	}
	o.SizesMB = slices.Compact(slices.Sorted(slices.Values(o.SizesMB)))
	if len(o.Kinds) == 0 {
		o.Kinds = []string{DataZero, DataRandom}
	}
	for _, k := range o.Kinds {
		if k != DataZero && k != DataRandom {
			return bad("data kind %q: use %s or %s", k, DataZero, DataRandom)
		}
	}
	if len(o.Stores) == 0 {
		o.Stores = []string{StoreLocal, StoreMinIO}
	}
	for _, s := range o.Stores {
		if s != StoreLocal && s != StoreMinIO {
			return bad("store %q: use %s or %s", s, StoreLocal, StoreMinIO)
		}
	}
	if o.Reps == 0 {
		o.Reps = DefaultSnapshotReps
	}
	if o.Reps < 1 {
		return bad("%d repetitions: use 1 or more", o.Reps)
	}
	if o.NOPReps == 0 {
		o.NOPReps = DefaultSnapshotNOPReps
	}
	if o.Python == "" {
		o.Python = "python3"
	}
	if o.WorkDir == "" {
		o.WorkDir = "/var/tmp"
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// SnapshotReport is the outcome of a snapshot benchmark; it is also the
// schema of results.json.
type SnapshotReport struct {
	Kind       string    `json:"kind"` // "snapshot"
	Machine    Machine   `json:"machine"`
	CRIU       string    `json:"criu"`        // version and how it is run
	CRIUCheck  string    `json:"criu_check"`  // `criu check`'s complaint, if any
	WorkDir    string    `json:"work_dir"`    // stores and baseline files
	WorkDirFS  string    `json:"work_dir_fs"` // its file system type
	ScratchDir string    `json:"scratch_dir"` // the service's scratch (restore unpacks here)
	ScratchFS  string    `json:"scratch_fs"`
	Baseline   string    `json:"baseline"` // the baseline's commands
	SizesMB    []int     `json:"sizes_mb"`
	Kinds      []string  `json:"kinds"`
	Stores     []string  `json:"stores"`
	Reps       int       `json:"reps"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
	// LoadAvgEnd is /proc/loadavg at the end (Machine.LoadAvg is at the
	// start): a streaming pipeline suffers more from CPUs busy with
	// other work than sequential steps do.
	LoadAvgEnd string `json:"loadavg_end"`
	// Runs holds every repetition of every path, in the order measured.
	Runs []SnapshotRun `json:"runs"`
	// Cells are the medians over repetitions, one per store, kind, size.
	Cells   []SnapshotCell `json:"cells"`
	NOP     *NOPResult     `json:"nop,omitempty"`
	Targets []TargetCheck  `json:"targets"`
}

// SnapshotRun is one checkpoint and restore of one instance along one
// path. Times are in milliseconds; stage times of the pipelined path are
// busy times (the stages overlap), the baseline's are its sequential steps.
type SnapshotRun struct {
	Store  string `json:"store"`
	Data   string `json:"data"`
	SizeMB int    `json:"size_mb"`
	Rep    int    `json:"rep"`
	Path   string `json:"path"`

	CheckpointMS float64 `json:"checkpoint_ms"` // whole checkpoint, upload and commit included
	DumpMS       float64 `json:"dump_ms"`       // CRIU's dump
	ArchiveMS    float64 `json:"archive_ms"`    // pipelined only: the dump's own busy time (image.Stats.Archive)
	CompressMS   float64 `json:"compress_ms"`   // pipelined: zstd; baseline: tar | zstd
	UploadMS     float64 `json:"upload_ms"`
	RawBytes     int64   `json:"raw_bytes"`    // image files (pipelined: their archive)
	StoredBytes  int64   `json:"stored_bytes"` // compressed object
	// CheckpointRSSBytes is the peak growth of this process's VmRSS over
	// the checkpoint (sampled every 5 ms); CheckpointWriteBytes the bytes
	// this process and its reaped children (CRIU, tar, zstd) wrote to
	// block devices (/proc/self/io write_bytes; MinIO's own writes and
	// tmpfs are not in it).
	CheckpointRSSBytes   int64 `json:"checkpoint_rss_bytes"`
	CheckpointWriteBytes int64 `json:"checkpoint_write_bytes"`

	RestoreMS     float64 `json:"restore_ms"` // from nothing to a running, restored instance
	DownloadMS    float64 `json:"download_ms"`
	DecompressMS  float64 `json:"decompress_ms"` // pipelined: zstd + extract busy; baseline: unzstd | untar
	ExtractMS     float64 `json:"extract_ms"`    // pipelined only: the extract part of DecompressMS
	CRIURestoreMS float64 `json:"criu_restore_ms"`
	// RestoreRSSBytes and RestoreWriteBytes are as for the checkpoint;
	// RestoredRSSBytes is the restored instance's VmRSS.
	RestoreRSSBytes   int64 `json:"restore_rss_bytes"`
	RestoreWriteBytes int64 `json:"restore_write_bytes"`
	RestoredRSSBytes  int64 `json:"restored_rss_bytes"`

	Error string `json:"error,omitempty"`
}

// TargetCheck is one target next to its measurement.
type TargetCheck struct {
	What     string  `json:"what"`
	TargetMS float64 `json:"target_ms"`
	GotMS    float64 `json:"got_ms"` // 0: not measured
	Met      bool    `json:"met"`
}

// Failures returns the number of failed runs, NOP ones included.
func (r *SnapshotReport) Failures() int {
	n := 0
	for _, run := range r.Runs {
		if run.Error != "" {
			n++
		}
	}
	if r.NOP != nil {
		n += len(r.NOP.Errors)
	}
	return n
}

// snapshotBench is the state of one Snapshot run.
type snapshotBench struct {
	opts    SnapshotOptions
	out     io.Writer
	log     *slog.Logger
	sbm     *sandbox.Manager
	engine  *criu.Engine
	keys    *image.Keyring
	py      config.Interpreter
	runtime string // snapshot.Meta.Runtime of every snapshot
	stores  map[string]blob.Store
	svcs    map[string]*snapshot.Service
	baseDir string // the baseline's files, on disk
	seq     int    // sandbox ids
}

// Snapshot measures checkpoint and restore of sandboxed Python instances
// through the snapshot service (pipelined: dump → archive → zstd → upload
// in one stream, and back) against the unpipelined baseline, for every
// size, data kind and store, and the restore latency of a NOP instance.
// It must run as root inside the torpor binary (see sandbox.IsInit), with
// CRIU installed. Failed runs do not make it fail: they are in the report
// (SnapshotReport.Failures), with their errors.
func Snapshot(ctx context.Context, opts SnapshotOptions, out io.Writer) (*SnapshotReport, error) {
	if err := opts.normalize(); err != nil {
		return nil, err
	}
	if os.Geteuid() != 0 {
		return nil, errdefs.Invalid("bench snapshot: must run as root (it starts sandboxes and runs CRIU): run it with sudo")
	}
	rep := &SnapshotReport{Kind: "snapshot", SizesMB: opts.SizesMB, Kinds: opts.Kinds, Stores: opts.Stores,
		Reps: opts.Reps, StartedAt: opts.Now().UTC(), Baseline: baselineDescription}
	b, cleanup, err := setupSnapshotBench(ctx, opts, out, rep)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	rep.Machine = probeMachine(ctx, b.py.Path, rep.StartedAt)

	// One unmeasured run of each path first: the first CRIU, Python,
	// MinIO and code paths of this binary start cold.
	fmt.Fprintln(out, "warm-up (not measured) ...")
	for _, store := range opts.Stores {
		for _, path := range []string{PathPipe, PathBase} {
			if run := b.measure(ctx, store, DataRandom, 1, 0, path); run.Error != "" {
				fmt.Fprintf(out, "warm-up %s %s failed: %s\n", store, path, run.Error)
			}
		}
	}
	for _, store := range opts.Stores {
		for _, kind := range opts.Kinds {
			for _, size := range cellSizes(opts, store, kind) {
				for r := 1; r <= opts.Reps; r++ {
					for _, path := range []string{PathPipe, PathBase} {
						run := b.measure(ctx, store, kind, size, r, path)
						rep.Runs = append(rep.Runs, run)
						printRun(out, run)
					}
				}
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
			}
		}
	}
	if opts.NOPReps > 0 && slices.Contains(opts.Stores, StoreLocal) {
		fmt.Fprintf(out, "NOP instance: %d restores from the local store, %d cold starts ...\n", opts.NOPReps, opts.NOPReps)
		rep.NOP = b.measureNOP(ctx, opts.NOPReps)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	rep.FinishedAt = opts.Now().UTC()
	rep.LoadAvgEnd = readTrim("/proc/loadavg")
	rep.Cells = summarizeCells(rep.Runs)
	rep.Targets = checkTargets(rep)

	fmt.Fprintln(out)
	PrintSnapshotTables(out, rep)
	if opts.OutDir != "" {
		if err := WriteSnapshotResults(opts.OutDir, rep); err != nil {
			return rep, err
		}
		fmt.Fprintf(out, "\nresults: %s/{results.json,results.csv,checkpoint.png,restore.png,nop.png}\n", opts.OutDir)
	}
	return rep, nil
}

// cellSizes are the sizes measured for a store and kind: the options',
// plus the target's size for random data in MinIO, which the targets name.
func cellSizes(opts SnapshotOptions, store, kind string) []int {
	if store == StoreMinIO && kind == DataRandom && !slices.Contains(opts.SizesMB, TargetSizeMB) {
		return slices.Sorted(slices.Values(append(slices.Clone(opts.SizesMB), TargetSizeMB)))
	}
	return opts.SizesMB
}

// setupSnapshotBench finds CRIU and Python, opens the stores (starting
// MinIO) and the sandbox manager. cleanup undoes it all.
func setupSnapshotBench(ctx context.Context, opts SnapshotOptions, out io.Writer, rep *SnapshotReport) (_ *snapshotBench, cleanup func(), err error) {
	var undo []func()
	cleanup = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if err != nil {
			cleanup()
		}
	}()
	b := &snapshotBench{opts: opts, out: out, log: opts.Log, stores: map[string]blob.Store{}, svcs: map[string]*snapshot.Service{}}
	if b.py, err = config.ResolvePython(ctx, opts.Python); err != nil {
		return nil, nil, fmt.Errorf("bench snapshot: %w", err)
	}
	ver, err := exec.CommandContext(ctx, b.py.Path, "-I", "-S", "-c", `import sys; print("python%d.%d.%d" % sys.version_info[:3])`).Output()
	if err != nil {
		return nil, nil, fmt.Errorf("bench snapshot: ask %s for its version: %w", b.py.Path, err)
	}
	b.runtime = strings.TrimSpace(string(ver)) + " at " + b.py.Path
	if b.engine, err = criu.New(ctx, "", ""); err != nil {
		return nil, nil, fmt.Errorf("bench snapshot: %w", err)
	}
	info, err := b.engine.Info(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("bench snapshot: %w", err)
	}
	rep.CRIU = info.Version + " (" + info.Source + ")"
	if info.Check != nil {
		rep.CRIUCheck = info.Check.Error()
	}
	key := make([]byte, 32)
	rand.Read(key)
	if b.keys, err = image.NewKeyring(key); err != nil {
		return nil, nil, err
	}

	work, err := os.MkdirTemp(opts.WorkDir, "torpor-bench-snapshot-")
	if err != nil {
		return nil, nil, fmt.Errorf("bench snapshot: work dir: %w (pass --work-dir)", err)
	}
	undo = append(undo, func() { os.RemoveAll(work) })
	rep.WorkDir, rep.WorkDirFS = work, fsType(work)
	if rep.WorkDirFS == "tmpfs" {
		fmt.Fprintf(out, "warning: %s is a tmpfs: the local store and the baseline's files are in memory, not on a disk\n", work)
	}
	b.baseDir = filepath.Join(work, "baseline")
	if err := os.Mkdir(b.baseDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("bench snapshot: %w", err)
	}

	for _, name := range opts.Stores {
		st, stop, err := openBenchStore(ctx, name, filepath.Join(work, name), opts.MinIO)
		if err != nil {
			return nil, nil, err
		}
		undo = append(undo, stop)
		svc, err := snapshot.NewService(b.engine, st, b.keys, snapshot.ServiceConfig{EngineVersion: b.engine.Version()}, b.log.With("store", name))
		if err != nil {
			return nil, nil, fmt.Errorf("bench snapshot: %w", err)
		}
		undo = append(undo, func() { _ = svc.Close() })
		b.stores[name], b.svcs[name] = st, svc
		fmt.Fprintf(out, "store %-5s: %s\n", name, st)
	}
	rep.ScratchDir = scratchDir()
	rep.ScratchFS = fsType(rep.ScratchDir)

	// The sandbox init the worker would use (see app.Run).
	var initPath string
	if exe, err := os.Executable(); err == nil {
		initPath = sandbox.FindInit(ctx, exe)
	}
	sbm, err := sandbox.NewManager(ctx, sandbox.Config{StateDir: filepath.Join(work, "sandbox"), InitPath: initPath}, b.log)
	if err != nil {
		return nil, nil, fmt.Errorf("bench snapshot: %w", err)
	}
	undo = append(undo, func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := sbm.Close(cctx); err != nil {
			fmt.Fprintf(out, "warning: %v\n", err)
		}
	})
	b.sbm = sbm
	fmt.Fprintf(out, "criu %s; python %s; work dir %s (%s); scratch %s (%s)\n",
		rep.CRIU, b.runtime, work, rep.WorkDirFS, rep.ScratchDir, rep.ScratchFS)
	return b, cleanup, nil
}

// scratchDir is the directory snapshot.Service picks by default.
func scratchDir() string {
	if fsType("/dev/shm") == "tmpfs" {
		return "/dev/shm"
	}
	return os.TempDir()
}

// fsType names the file system of path ("tmpfs", "ext4" ...), as far as
// statfs tells.
func fsType(path string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return "unknown"
	}
	switch st.Type {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.EXT4_SUPER_MAGIC:
		return "ext4"
	case unix.XFS_SUPER_MAGIC:
		return "xfs"
	case unix.BTRFS_SUPER_MAGIC:
		return "btrfs"
	case unix.OVERLAYFS_SUPER_MAGIC:
		return "overlay"
	}
	return fmt.Sprintf("0x%x", st.Type)
}

// instance is one running benchmark instance.
type instance struct {
	spec sandbox.Spec
	sb   *sandbox.Sandbox
}

// nextSpec returns the spec of a fresh instance holding sizeMB of kind.
func (b *snapshotBench) nextSpec(sizeMB int, kind string) sandbox.Spec {
	b.seq++
	var binds []sandbox.Bind
	if p := b.py.Prefix; p != "" && p != "/usr" && !strings.HasPrefix(p, "/usr/") {
		binds = append(binds, sandbox.Bind{Source: p, Target: p}) // as the worker binds it
	}
	return sandbox.Spec{
		ID:  "bench-snap-" + strconv.Itoa(b.seq),
		UID: benchUIDBase, GID: benchUIDBase,
		Binds:  binds,
		Argv:   []string{b.py.Path, "-I", "-S", "-c", workloadScript, strconv.Itoa(sizeMB), kind},
		Env:    []string{"PATH=/usr/bin:/bin"},
		Dir:    "/tmp",
		Limits: sandbox.Limits{MemoryMB: sizeMB + snapshotHeadroomMB, Pids: 64, TmpMB: 8, NoFile: 1024},
	}
}

// startInstance starts an instance and waits until its data is resident.
func (b *snapshotBench) startInstance(ctx context.Context, sizeMB int, kind string) (*instance, error) {
	spec := b.nextSpec(sizeMB, kind)
	sb, err := b.sbm.Start(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("start instance of %d MB %s: %w", sizeMB, kind, err)
	}
	in := &instance{spec: spec, sb: sb}
	if err := waitReady(ctx, sb, 2*time.Minute+time.Duration(sizeMB)*100*time.Millisecond); err != nil {
		b.destroy(in.sb)
		return nil, fmt.Errorf("instance of %d MB %s: %w", sizeMB, kind, err)
	}
	return in, nil
}

// waitReady polls for the workload's ready file.
func waitReady(ctx context.Context, sb *sandbox.Sandbox, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	path := "/proc/" + strconv.Itoa(sb.Pid()) + "/root" + workloadReadyFile
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		select {
		case <-sb.Done():
			st := sb.ExitStatus()
			return fmt.Errorf("exited before it was ready (code %d, signal %v, OOM-killed %t)", st.Code, st.Signal, st.OOMKilled)
		case <-ctx.Done():
			return fmt.Errorf("not ready within %s: %w", limit, ctx.Err())
		case <-time.After(workloadPollPeriod):
		}
	}
}

// verifyRestored checks that a restored instance runs and holds its data.
func verifyRestored(sb *sandbox.Sandbox, sizeMB int) (rss int64, err error) {
	select {
	case <-sb.Done():
		st := sb.ExitStatus()
		return 0, fmt.Errorf("restored instance exited (code %d, signal %v, OOM-killed %t)", st.Code, st.Signal, st.OOMKilled)
	default:
	}
	pid := strconv.Itoa(sb.Pid())
	marker, err := os.ReadFile("/proc/" + pid + "/root" + workloadReadyFile)
	if err != nil {
		return 0, fmt.Errorf("restored instance: its ready file: %w", err)
	}
	if got := strings.TrimSpace(string(marker)); got != strconv.Itoa(sizeMB<<20) {
		return 0, fmt.Errorf("restored instance: ready file says %q, want %d", got, sizeMB<<20)
	}
	rss, err = statusField("/proc/"+pid+"/status", "VmRSS:")
	if err != nil {
		return 0, fmt.Errorf("restored instance: %w", err)
	}
	if want := int64(sizeMB) << 20 * 9 / 10; rss < want {
		return rss, fmt.Errorf("restored instance: VmRSS %d MB, want at least %d MB: its data is not resident", rss>>20, want>>20)
	}
	return rss, nil
}

// destroy removes a sandbox, logging a failure: the manager's Close
// retries it at the end.
func (b *snapshotBench) destroy(sb *sandbox.Sandbox) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sb.Destroy(ctx); err != nil {
		b.log.Warn("destroy benchmark instance", "instance", sb.ID(), "err", err)
	}
}

// measure runs one repetition of one path; a failure is recorded in the
// run, and whatever it started is cleaned up.
func (b *snapshotBench) measure(ctx context.Context, store, kind string, sizeMB, rep int, path string) SnapshotRun {
	run := SnapshotRun{Store: store, Data: kind, SizeMB: sizeMB, Rep: rep, Path: path}
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	var err error
	if path == PathPipe {
		err = b.pipelined(ctx, &run)
	} else {
		err = b.baseline(ctx, &run)
	}
	if err != nil {
		run.Error = err.Error()
	}
	return run
}

// pipelined checkpoints a fresh instance through the snapshot service and
// restores it as a worker does.
func (b *snapshotBench) pipelined(ctx context.Context, run *SnapshotRun) error {
	svc := b.svcs[run.Store]
	src, err := b.startInstance(ctx, run.SizeMB, run.Data)
	if err != nil {
		return err
	}
	defer b.destroy(src.sb)

	probe := startProbe()
	t := time.Now()
	cspec, labels := b.sbm.CheckpointSpec(src.sb, src.spec, false)
	res, err := svc.Checkpoint(ctx, cspec,
		snapshot.Meta{Function: "bench-snapshot", Version: 1, Runtime: b.runtime, MemoryBytes: int64(run.SizeMB) << 20, Labels: labels})
	run.CheckpointMS = millisSince(t)
	run.CheckpointRSSBytes, run.CheckpointWriteBytes = probe.stop()
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := image.Delete(dctx, svc.Store(), res.ID); err != nil {
			b.log.Warn("delete benchmark snapshot", "snapshot", res.ID, "err", err)
		}
	}()
	run.DumpMS = millis(res.Checkpoint.Duration)
	run.ArchiveMS = millis(res.Image.Archive)
	run.CompressMS, run.UploadMS = millis(res.Image.Compress), millis(res.Image.Transfer)
	run.RawBytes, run.StoredBytes = res.Image.RawBytes, res.Image.CompressedBytes
	b.destroy(src.sb) // CRIU killed it: free its cgroup before the restore

	spec := b.nextSpec(run.SizeMB, run.Data)
	var rres snapshot.RestoreResult
	probe = startProbe()
	t = time.Now()
	dst, err := b.sbm.Restore(ctx, spec, func(ctx context.Context, env sandbox.RestoreEnv) (int, error) {
		var err error
		rres, err = svc.Restore(ctx, res.ID, snapshot.Expect{Runtime: b.runtime}, snapshot.RestoreSpec{Root: env.Root, Mounts: env.Mounts, ExecPrefix: env.ExecPrefix})
		return rres.Restore.Pid, err
	})
	run.RestoreMS = millisSince(t)
	run.RestoreRSSBytes, run.RestoreWriteBytes = probe.stop()
	run.DownloadMS = millis(rres.Image.Transfer)
	run.DecompressMS = millis(rres.Image.Compress + rres.Image.Archive)
	run.ExtractMS = millis(rres.Image.Archive)
	run.CRIURestoreMS = millis(rres.Restore.Duration)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer b.destroy(dst)
	run.RestoredRSSBytes, err = verifyRestored(dst, run.SizeMB)
	return err
}

// probe measures what one operation costs this process: the peak growth
// of its resident memory and the bytes it (and its reaped children) wrote
// to block devices.
type probe struct {
	rss    *rssSampler
	writes int64
}

func startProbe() *probe {
	// Return freed heap first, so that memory the last run left to the
	// Go runtime does not hide this run's growth.
	debug.FreeOSMemory()
	w, _ := ioWriteBytes()
	return &probe{rss: startRSSSampler(5 * time.Millisecond), writes: w}
}

func (p *probe) stop() (rss, writes int64) {
	rss = p.rss.stop()
	w, err := ioWriteBytes()
	if err != nil {
		return rss, -1
	}
	return rss, w - p.writes
}

func millis(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func millisSince(t time.Time) float64 { return millis(time.Since(t)) }
