package main

import (
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/bench"
)

// newBenchEvictCmd builds `torpor bench evict`. Like `bench snapshot` it
// needs no running torpor: it starts clusters of this binary (a gateway
// and two workers each) and evicts their workers.
func newBenchEvictCmd() *cobra.Command {
	var (
		opts    bench.EvictOptions
		out     string
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "evict",
		Short: "Calls moved on evictions: concurrent checkpoints, exactly-once trials, overhead vs re-run and Kappa-style (root, CRIU)",
		Long: `Evict measures calls that survive evictions (docs/migration.md) on real
process clusters of this binary: a torpor gateway with the embedded NATS and
two torpor workers, each with a home of its own, sharing a snapshot store
(--store minio: a MinIO it starts on loopback; local: a directory). It needs
root and CRIU (scripts/install-criu.sh), and MinIO for --store minio
(scripts/install-minio.sh). Parts (--parts, in this order):

  concurrency   R-Check §5.7: N sync calls (--n) holding --mb MB of random bytes run on one
                worker, which gets SIGTERM; a fresh worker takes them over.
                Per-call checkpoint and restore time from the call records,
                against the latency of an uninterrupted call.
  exactly-once  --trials calls, --batch at a time, of a function that draws
                random numbers and increments an external counter over HTTP
                at random steps; the worker gets SIGTERM at a random instant.
                Every result and count must be that of one uninterrupted run.
  overhead      R-Check Fig 5.7: --calls calls with durations from R-Check's
                Table 5.3 (times --time-scale) and evictions hitting --rates
                percent of them, under three policies measured in the same run:
                torpor (checkpoint and resume elsewhere), re-run from the start
                (--eviction-grace 0), and Kappa-style application checkpoints
                every 25 s to the same store. Each hit call runs twice: evicted
                at a random instant, and uninterrupted (its control).
                --time-scale shortens every duration, but not what a move
                costs: compare policies at 1.

It prints a table per part, with ratios against the baselines, and writes
results.json, results.csv and concurrency.png, exactly-once.png and
overhead.png to --out. It exits 1 if any call failed or any exactly-once trial
mismatched.`,
		Example: `  sudo torpor bench evict                                  # every part, MinIO; ~2 h on 2 cores
  sudo torpor bench evict --parts exactly-once --trials 100
  sudo torpor bench evict --parts overhead --calls 200 --time-scale 0.1 --store local   # a quick look`,
		Args: args(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.OutDir = benchOut(out, "evict")
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelDebug
			}
			opts.Log = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			rep, err := bench.Evict(cmd.Context(), opts, cmd.OutOrStdout())
			return benchDone(rep, err, opts.OutDir)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&opts.Parts, "parts", bench.EvictParts, "parts to run: concurrency, exactly-once, overhead")
	f.StringVar(&opts.Store, "store", bench.StoreMinIO, "snapshot store: minio (MinIO on loopback) or local (a directory under --out)")
	f.StringVar(&opts.MinIO, "minio", "", "MinIO server binary (default /var/cache/torpor/bin/minio, else minio on PATH)")
	f.StringVar(&opts.Binary, "binary", "", "torpor binary the clusters run (default this one; torpor-init must be beside it)")
	f.IntSliceVar(&opts.N, "n", bench.DefaultEvictN, "concurrency: calls moved at once")
	f.IntVar(&opts.MB, "mb", bench.DefaultEvictMB, "concurrency: MB of random bytes each call holds")
	f.Float64Var(&opts.CallSeconds, "call-seconds", bench.DefaultEvictCallSeconds, "concurrency: seconds each call runs uninterrupted")
	f.DurationVar(&opts.Grace, "grace", bench.DefaultEvictGrace, "concurrency: the workers' --eviction-grace")
	f.IntVar(&opts.Trials, "trials", bench.DefaultEvictTrials, "exactly-once: calls, each a trial")
	f.IntVar(&opts.Batch, "batch", bench.DefaultEvictBatch, "exactly-once: calls per eviction")
	f.IntVar(&opts.Calls, "calls", bench.DefaultEvictCalls, "overhead: calls of the workload")
	f.Float64SliceVar(&opts.Rates, "rates", bench.DefaultEvictRates, "overhead: eviction rates, percent of the calls hit")
	f.IntVar(&opts.Concurrency, "concurrency", bench.DefaultEvictConcurrency, "overhead: calls at once in the uninterrupted runs")
	f.Float64Var(&opts.TimeScale, "time-scale", bench.DefaultEvictTimeScale, "overhead: factor on Table 5.3's durations, the Kappa period and the grace (1: full length)")
	f.Uint64Var(&opts.Seed, "seed", bench.DefaultEvictSeed, "seed of the random draws (workload, victims, instants)")
	f.StringVar(&out, "out", "", "directory for the results (default bench/results/evict-<timestamp>)")
	f.BoolVarP(&verbose, "verbose", "v", false, "log the cluster harness to stderr")
	return cmd
}
