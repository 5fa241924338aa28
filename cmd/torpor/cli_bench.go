package main

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/bench"
)

// newBenchCmd builds `torpor bench`, the benchmarks anyone can rerun: they
// print ratios against a baseline measured in the same run and write raw
// results and a plot (see docs/benchmarks.md). The endpoint is the root's
// --endpoint, shared through g like every client command.
func newBenchCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark a running torpor against a baseline",
		Long: `Bench compares torpor with a baseline measured in the same run. "warm",
"starts", "density", "diversity" and "bursts" measure a running torpor
("torpor up") from the outside, over HTTP; "snapshot" measures the checkpoint
engine in-process (root and CRIU needed). Each benchmark prints a table and
writes results.json, results.csv and plots (docs/benchmarks.md,
docs/benchmarks-templates.md).`,
		Args: args(),
	}
	cmd.AddCommand(newBenchWarmCmd(g), newBenchSnapshotCmd(),
		newBenchStartsCmd(g), newBenchDensityCmd(g), newBenchDiversityCmd(g), newBenchBurstsCmd(g), newBenchEvictCmd())
	return cmd
}

// benchOut returns the --out directory: out, or bench/results/<name>-<UTC
// timestamp> when empty.
func benchOut(out, name string) string {
	if out != "" {
		return out
	}
	return filepath.Join("bench", "results", name+"-"+time.Now().UTC().Format("20060102T150405Z"))
}

// platformFlags registers the flags every benchmark of a running torpor
// has (--out, --python) and returns a function that fills opts from them
// and the root's --endpoint and token, once the flags are parsed.
func platformFlags(cmd *cobra.Command, g *globals, name string, opts *bench.PlatformOptions) func() {
	var out string
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "directory for results.json, results.csv and the plots (default bench/results/"+name+"-<timestamp>)")
	f.StringVar(&opts.Python, "python", "python3", "interpreter of the fork-per-call baseline (resolved behind shims)")
	return func() {
		opts.Endpoint, opts.Token, opts.OutDir = g.endpoint, g.apiToken(), benchOut(out, name)
	}
}

// failedCalls is the error of a benchmark some of whose measured calls
// failed: the command exits 1, after the tables.
func failedCalls(n int, out string) error {
	return fmt.Errorf("%d measured calls failed (see above and %s): the numbers are not a clean measurement", n, filepath.Join(out, "results.json"))
}

// benchDone turns a benchmark's outcome into the command's: its error, or
// failedCalls when any measured call failed.
func benchDone[R interface{ Failures() int }](rep R, err error, out string) error {
	if err != nil {
		return err
	}
	if n := rep.Failures(); n > 0 {
		return failedCalls(n, out)
	}
	return nil
}

func newBenchWarmCmd(g *globals) *cobra.Command {
	var (
		opts bench.WarmOptions
		out  string
	)
	cmd := &cobra.Command{
		Use:   "warm",
		Short: "Warm-call latency of a NOP Python function vs a bare Python HTTP server",
		Long: `Warm deploys bench-nop (def handler(e, c): return {}), warms it, then makes
--calls calls at each --concurrency through torpor's REST API and its Lambda
API, and the same number against a bare Python http.server it starts on
127.0.0.1 (the baseline). It prints latency percentiles, throughput and the
ratio of torpor's p50 and p99 to the baseline's, and writes every latency to
--out. It exits 1 if any measured call failed.`,
		Example: `  torpor bench warm
  torpor bench warm --calls 5000 --concurrency 1,4,16 --out /tmp/warm`,
		Args: args(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Calls < 1 {
				return usageError{fmt.Errorf("invalid --calls %d: use 1 or more", opts.Calls)}
			}
			if opts.Warmup < 0 {
				return usageError{fmt.Errorf("invalid --warmup %d: use 0 or more", opts.Warmup)}
			}
			if opts.Warmup == 0 {
				opts.Warmup = -1 // WarmOptions: 0 means the default, -1 none
			}
			for _, c := range opts.Concurrency {
				if c < 1 || c > 1000 {
					return usageError{fmt.Errorf("invalid --concurrency %d: use 1-1000", c)}
				}
			}
			if out == "" {
				out = filepath.Join("bench", "results", "warm-"+time.Now().UTC().Format("20060102T150405Z"))
			}
			opts.Endpoint, opts.Token, opts.OutDir = g.endpoint, g.apiToken(), out
			rep, err := bench.Warm(cmd.Context(), opts, cmd.OutOrStdout())
			return benchDone(rep, err, out)
		},
	}
	f := cmd.Flags()
	f.IntVar(&opts.Calls, "calls", bench.DefaultWarmCalls, "measured calls per series and concurrency")
	f.IntVar(&opts.Warmup, "warmup", bench.DefaultWarmWarmup, "unmeasured calls per series and concurrency made first")
	f.IntSliceVar(&opts.Concurrency, "concurrency", bench.DefaultWarmConcurrency, "numbers of parallel clients to measure, comma-separated")
	f.StringVar(&out, "out", "", "directory for results.json, results.csv and latency.png (default bench/results/warm-<timestamp>)")
	f.StringVar(&opts.Python, "python", "python3", "interpreter of the baseline server (resolved behind shims)")
	return cmd
}
