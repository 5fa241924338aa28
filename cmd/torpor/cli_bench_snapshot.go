package main

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/bench"
)

// newBenchSnapshotCmd builds `torpor bench snapshot`. Unlike the other
// benchmarks it runs in this process, not against a running torpor: the
// sandboxes it snapshots re-exec this binary as their init.
func newBenchSnapshotCmd() *cobra.Command {
	var (
		opts    bench.SnapshotOptions
		out     string
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Checkpoint and restore time of sandboxed Python instances vs an unpipelined baseline (root, CRIU)",
		Long: `Snapshot measures the snapshot engine in this process, as a worker runs it (it
needs root and CRIU, from scripts/install-criu.sh, and starts its own MinIO,
from scripts/install-minio.sh). For every --sizes, data kind (touched zero
pages, random bytes) and store (a local directory under --work-dir, MinIO on
loopback), --reps times, it starts a sandboxed Python instance holding that
much data, checkpoints it through the snapshot service (criu dump streamed
through archive, zstd and upload at once) and restores it (download, unzstd
and unpack into tmpfs at once, then criu restore). The baseline, on an
identical fresh instance in the same run, does the same one step after the
other through files on disk: criu dump to a directory, tar | zstd, upload;
download, unzstd | untar, criu restore.

It prints median times with the ratio pipelined / baseline, per-stage
throughput in MB/s, the restore latency of a NOP instance (--nop-reps) against
its cold start, and the targets (100 MB random to MinIO: checkpoint <= 1 s,
restore <= 0.5 s; NOP restore <= 50 ms); it writes results.json, results.csv,
checkpoint.png, restore.png and nop.png to --out. 100 MB random data in
MinIO is always measured, for the targets. An instance's memory limit is its
size + 128 MB; a 2048 MB run needs about 7 GB of free memory (the instance,
its unpacked image in /dev/shm, the page cache). It exits 1 if any run failed.`,
		Example: `  sudo torpor bench snapshot
  sudo torpor bench snapshot --sizes 1,64 --reps 1 --stores local --nop-reps 20`,
		Args: args(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, s := range opts.SizesMB {
				if s < 1 || s > bench.MaxSnapshotSizeMB {
					return usageError{fmt.Errorf("invalid --sizes %d: use 1-%d (MB)", s, bench.MaxSnapshotSizeMB)}
				}
			}
			if opts.Reps < 1 {
				return usageError{fmt.Errorf("invalid --reps %d: use 1 or more", opts.Reps)}
			}
			if opts.NOPReps < 0 {
				return usageError{fmt.Errorf("invalid --nop-reps %d: use 0 (none) or more (p99 wants 20 or more)", opts.NOPReps)}
			}
			if opts.NOPReps == 0 {
				opts.NOPReps = -1 // SnapshotOptions: 0 means the default, -1 none
			}
			if out == "" {
				out = filepath.Join("bench", "results", "snapshot-"+time.Now().UTC().Format("20060102T150405Z"))
			}
			opts.OutDir = out
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelDebug
			}
			opts.Log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			rep, err := bench.Snapshot(cmd.Context(), opts, cmd.OutOrStdout())
			if err != nil {
				return err
			}
			if n := rep.Failures(); n > 0 {
				return fmt.Errorf("%d runs failed (see above and %s): the numbers are not a clean measurement", n, filepath.Join(out, "results.json"))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntSliceVar(&opts.SizesMB, "sizes", bench.DefaultSnapshotSizes, "instance data sizes in MB, comma-separated (1-2048; 2048 needs ~7 GB free memory)")
	f.StringSliceVar(&opts.Kinds, "data", []string{bench.DataZero, bench.DataRandom}, "data kinds: zero (touched zero pages), random (os.urandom)")
	f.StringSliceVar(&opts.Stores, "stores", []string{bench.StoreLocal, bench.StoreMinIO}, "stores: local (directory under --work-dir), minio (MinIO on loopback)")
	f.IntVar(&opts.Reps, "reps", bench.DefaultSnapshotReps, "repetitions per size, data kind, store and path")
	f.IntVar(&opts.NOPReps, "nop-reps", bench.DefaultSnapshotNOPReps, "restores (and cold starts) of the NOP instance from the local store; 0: none")
	f.StringVar(&out, "out", "", "directory for the results (default bench/results/snapshot-<timestamp>)")
	f.StringVar(&opts.Python, "python", "python3", "the instances' interpreter (resolved behind shims)")
	f.StringVar(&opts.MinIO, "minio", "", "MinIO server binary (default /var/cache/torpor/bin/minio, else minio on PATH)")
	f.StringVar(&opts.WorkDir, "work-dir", "/var/tmp", "directory, on a disk, for the local store, MinIO's data and the baseline's files")
	f.BoolVarP(&verbose, "verbose", "v", false, "log the snapshot service and sandboxes to stderr")
	return cmd
}
